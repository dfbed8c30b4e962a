from __future__ import annotations

from dlq.capture.fingerprint import fingerprint, normalize_error


def test_normalize_strips_numbers_uuids_hex_and_quoted_values() -> None:
    text = (
        "Order 4711 not found for customer 'alice' (trace 3f2a9c0d1e, "
        "id 123e4567-e89b-12d3-a456-426614174000) at 0xdeadbeef"
    )
    assert normalize_error(text) == (
        "Order <n> not found for customer <str> (trace <hex>, id <uuid>) at <hex>"
    )


def test_occurrences_of_one_failure_share_a_fingerprint() -> None:
    a = fingerprint(1, "rejected", "OrderNotFound", "order 4711 missing")
    b = fingerprint(1, "rejected", "OrderNotFound", "order 4712 missing")
    assert a == b


def test_fingerprint_separates_channels_reasons_and_error_classes() -> None:
    base = fingerprint(1, "rejected", "OrderNotFound", "order 1 missing")
    assert fingerprint(2, "rejected", "OrderNotFound", "order 1 missing") != base
    assert fingerprint(1, "expired", "OrderNotFound", "order 1 missing") != base
    assert fingerprint(1, "rejected", "Timeout", "order 1 missing") != base
    assert fingerprint(1, "rejected", "OrderNotFound", "customer 1 missing") != base


def test_normalize_bounds_long_input() -> None:
    assert len(normalize_error("x" * 100_000)) <= 500
