"""``pk__any``: one array parameter on PostgreSQL (a constant statement text), IN elsewhere."""

from __future__ import annotations

import pytest
from django.db import connection

from dlq.models import DeadLetter, ReplayItem
from tests.conftest import make_channel
from tests.dlq.conftest import letter, store

pytestmark = [pytest.mark.django_db]


def test_any_matches_exactly_the_listed_ids() -> None:
    entries = store(make_channel(), *[letter() for _ in range(4)])
    wanted = [entries[0].pk, entries[2].pk]
    assert sorted(DeadLetter.objects.filter(pk__any=wanted).values_list("pk", flat=True)) == wanted
    assert not DeadLetter.objects.filter(pk__any=[]).exists()
    assert DeadLetter.objects.exclude(pk__any=wanted).count() == 2


def test_the_statement_text_does_not_grow_with_the_list() -> None:
    short, _ = DeadLetter.objects.filter(pk__any=[1]).query.sql_with_params()
    long, params = DeadLetter.objects.filter(pk__any=list(range(500))).query.sql_with_params()
    if connection.vendor == "postgresql":
        assert "= ANY(" in short and short == long
        assert params == ("{" + ",".join(str(i) for i in range(500)) + "}",)
    else:
        assert "IN (" in long


def test_any_takes_ids_beyond_32_bits_and_on_an_integer_column() -> None:
    """The text form is cast to ``bigint[]``: 64-bit ids match, and a 32-bit column compares
    with it as well (SQLite: the IN list)."""
    entries = store(make_channel(), letter(), letter())
    assert not DeadLetter.objects.filter(pk__any=[2**40, 2**62]).exists()
    found = DeadLetter.objects.filter(pk__any=[2**40, entries[1].pk])
    assert list(found.values_list("pk", flat=True)) == [entries[1].pk]
    assert not ReplayItem.objects.filter(position__any=[0, 2**31 - 1]).exists()
