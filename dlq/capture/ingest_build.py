"""Turning one broker letter into an unsaved dead-letter row (``build_entry``).

The row is plain column values (``Row``: attname -> value), not a model instance: COPY writes
the values as they are, and a model's ``__init__`` with its per-field ``setattr`` cost more than
the rest of the build (bench/ingest.py, docs/performance.md "Ingest"). JSON fields are encoded
once here; COPY sends that text and the server parses it into jsonb.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from brokers import redis_streams
from brokers.base import DeadLetter as Letter
from channels_registry import schemas
from channels_registry.models import (
    BrokerKind,
    Channel,
    ChannelHealth,
    DlqStrategy,
    IdempotencySource,
)
from dlq.capture import message
from dlq.capture.fingerprint import fingerprint
from dlq.models import DeadLetter, Source
from dlq.text import redaction, render

SEARCH_TEXT_LIMIT = 4000
# Where producers and consumers commonly put the error of a failed message (Spring AMQP,
# MassTransit, our Redis convention, plain names). The first present header wins.
ERROR_CLASS_HEADERS = (
    "x-exception-class",
    "x-exception-type",
    "x-error-class",
    "error_class",
    "error-class",
    "exception_class",
    "MT-Fault-ExceptionType",
)
ERROR_MESSAGE_HEADERS = (
    "x-exception-message",
    "x-error-message",
    "x-error",
    "error_message",
    "error",
    "exception",
    "MT-Fault-Message",
)
SCHEMA_VERSION_HEADERS = ("schema-version", "schema_version", "x-schema-version")
JSON_CONTENT_TYPES = ("json", "")  # an empty content type is assumed to be JSON


def _no_nul(value: Any, depth: int = 0) -> Any:
    """PostgreSQL text and jsonb refuse NUL characters. Strings holding one become
    ``{"$bytes": hex}`` (the adapters' own convention for non-text bytes), so nothing is lost."""
    if depth > 40:
        return value
    if isinstance(value, str):
        return {"$bytes": value.encode("utf-8").hex()} if "\x00" in value else value
    if isinstance(value, dict):
        return {k.replace("\x00", "\ufffd"): _no_nul(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nul(v, depth + 1) for v in value]
    return value


def _json_no_nul(value: Any) -> tuple[Any, str]:
    """``value`` made NUL-free (see ``_no_nul``) and its JSON text, which COPY sends as is.
    Encoding once is what COPY needs anyway, and JSON escapes every NUL as ``\\u0000``, so the
    copying walk of ``_no_nul`` only runs for the rare value that holds one."""
    if not value and isinstance(value, dict | list):
        return value, "{}" if isinstance(value, dict) else "[]"
    text = json.dumps(value)
    if "\\u0000" in text:  # also matches an escaped backslash before "u0000": harmless
        value = _no_nul(value)
        text = json.dumps(value)
    return value, text


def _text(value: Any, limit: int) -> str:
    if type(value) is str:  # the common case, first
        return (value.replace("\x00", "\ufffd") if "\x00" in value else value)[:limit]
    if value is None:
        return ""
    if isinstance(value, dict) and "$bytes" in value:
        try:
            value = bytes.fromhex(str(value["$bytes"])).decode("utf-8", "replace")
        except ValueError:
            value = ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text.replace("\x00", "\ufffd")[:limit]


def _first_header(lowered: dict[str, Any], names: Sequence[str]) -> Any:
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


def _aware(epoch: float | None) -> dt.datetime | None:
    if epoch is None:
        return None
    try:
        return dt.datetime.fromtimestamp(epoch, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None


def read_idempotency_key(
    channel: Channel, headers: dict[str, Any], properties: dict[str, Any], document: Any
) -> str:
    """The key from the channel's declared location; "" when absent."""
    source, where = channel.idempotency_source, channel.idempotency_key
    value: Any = None
    if source == IdempotencySource.HEADER and where:
        value = _first_header(message.lowered(headers), [where])
    elif source == IdempotencySource.PROPERTY:
        value = properties.get("message_id")
    elif source == IdempotencySource.JSON_PATH and render.is_parsed(document):
        steps = redaction.parse_path(where)
        value = document
        for step in steps or [None]:
            if isinstance(step, str) and isinstance(value, dict):
                value = value.get(step)
            elif isinstance(step, int) and isinstance(value, list) and step < len(value):
                value = value[step]
            else:
                value = None
                break
    if value is None or isinstance(value, dict | list):
        return ""
    return _text(value, 255)


def search_text(body_view: bytes | None, headers: dict[str, Any]) -> str:
    """Lower-cased text searched by the list filter: the (redacted) body head, then headers."""
    parts = []
    if body_view:
        parts.append(body_view[:SEARCH_TEXT_LIMIT].decode("utf-8", "replace"))
    for key, value in list(headers.items())[:200]:
        parts.append(f"{key}: {_text(value, 300)}")
    return "\n".join(parts).replace("\x00", " ").lower()[: SEARCH_TEXT_LIMIT * 2]


class Row:
    """An unsaved dead-letter row: its column values by attname, read and set as attributes
    (``row.dedupe_key``, ``row.group_id = 7``) like the model's, so the batch's bookkeeping
    (groups, lineage, trends) needs no model instance. ``values`` is the same dict."""

    dedupe_key: str
    group_id: int | None
    parent_id: int | None
    generation: int

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__ = values

    def __getattr__(self, name: str) -> Any:  # only called for names missing from the dict
        raise AttributeError(name)

    @property
    def values(self) -> dict[str, Any]:
        return self.__dict__

    def model(self) -> DeadLetter:
        """The row as an unsaved model instance (SQLite's ``bulk_create``)."""
        return DeadLetter(**self.__dict__)


class Built(NamedTuple):
    entry: Row  # the unsaved row
    fingerprint: str  # of its failure, for the group
    json_text: dict[str, str]  # attname -> JSON text of the row's JSON fields, for COPY


def as_written(channel: Channel, letter: Letter) -> Letter:
    """The letter read with the channel's declared Redis entry layout (see
    ``brokers.redis_streams.apply_layout``); other brokers' letters are unchanged."""
    if channel.broker.kind != BrokerKind.REDIS:
        return letter
    layout = redis_streams.EntryLayout(
        kind=channel.entry_layout,
        body_field=channel.entry_body_field or redis_streams.BODY_FIELD,
        metadata_fields=tuple(channel.entry_metadata_fields or ())
        or redis_streams.DEFAULT_METADATA_FIELDS,
    )
    return redis_streams.apply_layout(letter, layout)


def _delivery_limit(channel: Channel) -> int | None:
    """The main queue's delivery limit as last observed (quorum ``delivery-limit``), else the
    declared retry budget. Cached on the instance: one query per batch."""
    if "_delivery_limit" not in channel.__dict__:
        observed = (
            ChannelHealth.objects.filter(channel=channel).values_list("observed", flat=True).first()
        )
        limit = observed.get("delivery_limit") if isinstance(observed, dict) else None
        channel.__dict__["_delivery_limit"] = (
            limit if isinstance(limit, int) and limit > 0 else channel.retry_max_attempts
        )
    value = channel.__dict__["_delivery_limit"]
    return value if isinstance(value, int) else None


def build_entry(channel: Channel, letter: Letter, source: str, now: dt.datetime) -> Built:
    """The unsaved row for ``letter``, its failure fingerprint and its JSON as text."""
    letter = as_written(channel, letter)
    headers, headers_json = _json_no_nul(letter.headers)
    properties, properties_json = _json_no_nul(letter.properties)
    death_history, death_history_json = _json_no_nul(list(letter.death_history))
    # Header names are case-insensitive (NATS clients send ``Content-Type``): keyed in lower
    # case once, for every lookup below.
    lowered = message.lowered(headers)
    content_type = _text(properties.get("content_type") or lowered.get("content-type"), 200)
    document = render.parse_json(letter.body)
    is_parseable = _is_parseable(content_type, document)
    found_in = source
    source = _routed_source(channel, source, is_parseable)
    visible_headers = redaction.redact_headers(headers, channel)
    t = _triage(channel, letter, headers, lowered, visible_headers, properties, document, source)
    body_view = _body_view(channel, letter, document)
    limit = _delivery_limit(channel)
    entry = Row(
        {
            "channel_id": channel.pk,
            "source": t.source,
            "dedupe_key": letter.dedupe_key[:200],
            "body": letter.body,
            "body_sha256": hashlib.sha256(letter.body).hexdigest(),
            "size": len(letter.body),
            "content_type": content_type,
            "headers": headers,
            "properties": properties,
            "reason": t.reason,
            "error_class": t.error_class,
            "error_message": t.error_message,
            "redelivery_count": message.delivery_count(
                letter.redelivery_count, lowered, t.job, delivery_limit=limit
            ),
            "first_death_queue": _text(letter.first_death_queue, 255),
            "first_death_exchange": _text(letter.first_death_exchange, 255),
            "first_death_at": _aware(letter.first_death_at),
            "dead_lettered_at": _aware(letter.dead_lettered_at) or now,
            "ingested_at": now,
            "idempotency_key": t.idempotency_key,
            "missing_idempotency_key": not t.idempotency_key,
            "schema_version": t.schema_version,
            "schema_error": t.schema_error,
            "message_type": t.message_type,
            "job": t.job,
            "is_parseable": is_parseable,
            "death_history": death_history,
            "group_id": None,
            "parent_id": None,
            "generation": 0,
            "purged_at": None,
            "search_text": search_text(body_view, visible_headers),
        }
    )
    json_text = {
        "headers": headers_json,
        "properties": properties_json,
        "death_history": death_history_json,
    }
    json_text["schema_error"] = t.schema_error_json
    json_text["job"] = t.job_json
    # An entry classified poison although found in the DLQ never shares a group with the DLQ
    # entries that failed the same way: a group is of one source.
    rerouted = t.source if t.source != found_in else ""
    print_ = fingerprint(
        channel.pk, t.reason, t.error_class, t.error_message, t.message_type, rerouted=rerouted
    )
    return Built(entry, print_, json_text)


def _is_parseable(content_type: str, document: Any) -> bool | None:
    """Whether a JSON (or untyped) body parses; None for any other content type."""
    if any(t and t in content_type.lower() for t in JSON_CONTENT_TYPES) or not content_type:
        return render.is_parsed(document)
    return None


def _routed_source(channel: Channel, source: str, is_parseable: bool | None) -> str:
    """Poison vs DLQ. Where a letter was found decides first (the poison address is poison).
    A letter found in the DLQ of a channel that declares the poison-queue strategy but whose
    body does not parse was misrouted: the contract says unparseable messages are poison
    (never retried), so it is classified as poison. Without that strategy there is no poison
    contract; the entry stays DLQ and carries the is_parseable=False flag."""
    if (
        source == Source.DLQ
        and is_parseable is False
        and DlqStrategy.POISON_QUEUE in (channel.dlq_strategies or [])
    ):
        return Source.POISON
    return source


class _Triage(NamedTuple):
    source: str
    reason: str
    error_class: str
    error_message: str
    job: Any  # the recognised job, NUL-free
    job_json: str
    message_type: str
    idempotency_key: str
    schema_version: str
    schema_error: Any
    schema_error_json: str


def _triage(
    channel: Channel,
    letter: Letter,
    headers: dict[str, Any],
    lowered: message.Lowered,
    visible_headers: dict[str, Any],
    properties: dict[str, Any],
    document: Any,
    source: str,
) -> _Triage:
    """What failed and why (from the headers, a known job client, the registered schema),
    the message type and the idempotency key. ``lowered`` is ``headers`` keyed in lower case."""
    visible_lowered = lowered if visible_headers is headers else message.lowered(visible_headers)
    reason = _text(letter.reason or _first_header(lowered, ["reason", "x-first-death-reason"]), 100)
    # The cause, first found wins: what the broker carried for this death (a NATS term
    # reason), the headers (a DLQ copy's, or the message's own), the body fields the channel
    # declares as error metadata.
    body_metadata = _body_metadata(channel, document)
    error_class = _text(
        letter.error_class
        or _first_header(visible_lowered, ERROR_CLASS_HEADERS)
        or _first_header(body_metadata, ERROR_CLASS_HEADERS),
        300,
    )
    error_message = _text(
        letter.error_message
        or _first_header(visible_lowered, ERROR_MESSAGE_HEADERS)
        or _first_header(body_metadata, ERROR_MESSAGE_HEADERS),
        10_000,
    )
    # Job-aware triage: the type and what a known job client (Celery, Sidekiq) says.
    job = message.recognise_job(lowered, document)
    mtype = message.message_type(channel, lowered, document, job)
    error_class = error_class or _text(job.get("error_class"), 300)
    error_message = error_message or _text(job.get("error_message"), 10_000)
    # A field-map Redis entry keeps its fields as the message: a header-declared key is there.
    key_headers: dict[str, Any] = lowered
    if isinstance(properties.get(redis_streams.ORIGINAL_FIELDS), list):
        key_headers = {**dict(properties[redis_streams.ORIGINAL_FIELDS]), **headers}
    idem = read_idempotency_key(channel, key_headers, properties, document)
    schema = _first_header(lowered, SCHEMA_VERSION_HEADERS)
    if schema is None and isinstance(document, dict):
        schema = document.get("schema_version", document.get("schemaVersion"))
    # P1: a body failing the channel's registered schema is poison, the validation error its
    # reason (the entry's own schema version selects the schema when it is registered).
    invalid = schemas.failure(
        channel,
        document,
        _text(schema, 50) if schema is not None else "",
        parsed=render.is_parsed(document),
    )
    if invalid is not None:
        source = Source.POISON
        reason = _text(f"schema-invalid: {invalid.message}", 100)
        error_class = "SchemaValidationError"
        error_message = f"{invalid.path}: {invalid.message}"
    schema_error, schema_error_json = _json_no_nul(invalid.as_dict() if invalid else {})
    job, job_json = _json_no_nul(job)
    schema_version = _text(schema, 50) if schema is not None else ""
    return _Triage(
        source, reason, error_class, error_message, job, job_json, mtype, idem,
        schema_version, schema_error, schema_error_json,
    )  # fmt: skip


def _body_metadata(channel: Channel, document: Any) -> dict[str, Any]:
    """The body's top-level fields the channel declares as error metadata
    (``entry_metadata_fields``; a trailing ``*`` matches a prefix), by lower-cased name, for
    brokers whose messages carry their error in the body. Redis reads those names from the
    entry's fields instead (``as_written``); a field the channel redacts is never read."""
    declared = [str(f).lower() for f in channel.entry_metadata_fields or []]
    if not declared or channel.broker.kind == BrokerKind.REDIS or not isinstance(document, dict):
        return {}
    redacted = {str(p).lower().removeprefix("$.") for p in channel.redact_json_paths or []}
    found: dict[str, Any] = {}
    for name, value in list(document.items())[:500]:
        low = str(name).lower()
        if low in redacted or isinstance(value, dict | list):
            continue
        if any(low == d or (d.endswith("*") and low.startswith(d[:-1])) for d in declared):
            found[low] = value
    return found


def _body_view(channel: Channel, letter: Letter, document: Any) -> bytes | None:
    """The body the search text may read: redacted when the channel has JSON redaction
    rules, None when they cannot be applied (so it stays out of the search text)."""
    if isinstance(document, dict | list) and channel.redact_json_paths:
        return render.redacted_body_bytes(letter.body, channel)
    if channel.redact_json_paths:
        return None  # rules cannot be applied: keep the body out of the search text
    return letter.body
