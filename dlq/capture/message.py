"""Reading a dead letter the way its client wrote it: the job or message type, what a known job
client says about the job, and how often the message was really delivered.

Recognised out of the box (no declaration needed):

- Celery, message protocol 2 (AMQP headers): ``task`` is the type; ``id``, ``retries``,
  ``argsrepr``/``kwargsrepr``, ``root_id``/``parent_id`` and ``eta`` describe the job. The
  ``*repr`` values are what Celery itself chose to show (it truncates them); nothing is evaluated.
- Sidekiq-style JSON jobs (``{"class": …, "jid": …, "args": […]}``, also written by other job
  libraries): ``class`` (or ``wrapped`` for ActiveJob) is the type; ``jid``, ``retry_count``,
  ``queue``, ``error_class``/``error_message`` describe it.

A channel may instead declare where its type lives (a header, or a JSON path in the body).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from dlq.text import redaction, render

#: Headers counting deliveries, beyond RabbitMQ's x-death count: quorum queues count failed
#: deliveries in ``x-delivery-count``; retry libraries write ``x-attempts`` / ``x-retry-count``.
DELIVERY_COUNT_HEADERS = ("x-delivery-count", "x-attempts", "x-retry-count", "x-retries")
MAX_TEXT = 500


class Lowered(dict[str, Any]):
    """Headers already keyed in lower case (the lookups here take them as they are)."""


def lowered(headers: dict[str, Any]) -> Lowered:
    """``headers`` keyed in lower case, once per message for every lookup below."""
    if isinstance(headers, Lowered):
        return headers
    return Lowered({str(k).lower(): v for k, v in headers.items()})


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    if value is None or isinstance(value, dict | list):
        return ""
    return str(value).replace("\x00", "\ufffd")[:limit]


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def json_path(document: Any, path: str) -> Any:
    """The value at ``$.a.b[0]`` in a parsed document, or None."""
    if not render.is_parsed(document):
        return None
    value = document
    for step in redaction.parse_path(path) or [None]:
        if isinstance(step, str) and isinstance(value, dict):
            value = value.get(step)
        elif isinstance(step, int) and isinstance(value, list) and step < len(value):
            value = value[step]
        else:
            return None
    return value


def recognise_job(headers: dict[str, Any], document: Any) -> dict[str, Any]:
    """What a known job client says about this message; ``{}`` when it is not one."""
    keyed = lowered(headers)
    if isinstance(keyed.get("task"), str) and "id" in keyed:
        job: dict[str, Any] = {"kind": "celery", "type": _text(keyed["task"], 200)}
        job["id"] = _text(keyed.get("id"), 200)
        retries = _int(keyed.get("retries"))
        if retries is not None:
            job["retries"] = retries
        for name in ("argsrepr", "kwargsrepr", "root_id", "parent_id", "eta", "origin"):
            if keyed.get(name) not in (None, ""):
                job[name] = _text(keyed[name])
        return job
    if isinstance(document, dict) and isinstance(document.get("class"), str) and "jid" in document:
        wrapped = document.get("wrapped")
        job = {
            "kind": "sidekiq",
            "type": _text(wrapped if isinstance(wrapped, str) else document["class"], 200),
            "id": _text(document.get("jid"), 200),
        }
        retries = _int(document.get("retry_count"))
        if retries is not None:
            job["retries"] = retries
        for name in ("queue", "error_class", "error_message"):
            if isinstance(document.get(name), str):
                job[name] = _text(document[name])
        if isinstance(document.get("args"), list):
            job["argsrepr"] = _text(json.dumps(document["args"], ensure_ascii=False))
        return job
    return {}


def message_type(channel: Any, headers: dict[str, Any], document: Any, job: dict[str, Any]) -> str:
    """The declared type (header or JSON path) or, undeclared, the recognised job's type."""
    source, where = channel.message_type_source, channel.message_type_key
    if source == "header" and where:
        return _text(lowered(headers).get(where.lower()), 200)
    if source == "json-path" and where:
        return _text(json_path(document, where), 200)
    return _text(job.get("type"), 200)


def delivery_count(
    broker_count: int | None,
    headers: dict[str, Any],
    job: dict[str, Any],
    *,
    delivery_limit: int | None = None,
) -> int | None:
    """The most redeliveries any source reports: the broker's (x-death count), quorum
    ``x-delivery-count``, retry headers, a job client's retry counter. None when none does.

    A quorum queue drops ``x-delivery-count`` when it dead-letters for ``delivery_limit``, so
    such a death (``x-death`` reason ``delivery_limit``) counts ``delivery_limit`` redeliveries:
    the queue's limit as observed, else the declared budget (the caller passes it)."""
    keyed = lowered(headers)
    counts = [c for c in (_int(keyed.get(h)) for h in DELIVERY_COUNT_HEADERS) if c is not None]
    if broker_count is not None:
        counts.append(broker_count)
    if delivery_limit is not None and delivery_limit > 0 and died_of_delivery_limit(headers):
        counts.append(delivery_limit)
    if isinstance(job.get("retries"), int):
        counts.append(job["retries"])
    counts = [c for c in counts if c >= 0]
    return max(counts) if counts else None


def died_of_delivery_limit(headers: dict[str, Any]) -> bool:
    keyed = lowered(headers)
    if keyed.get("x-first-death-reason") == "delivery_limit":
        return True
    deaths = keyed.get("x-death")
    return isinstance(deaths, list) and any(
        isinstance(d, dict) and d.get("reason") == "delivery_limit" for d in deaths
    )


def as_time(value: Any) -> dt.datetime | None:
    """An AMQP timestamp (epoch seconds; milliseconds when implausibly large) as a UTC time."""
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is None:
        return None
    if number > 10**11:  # milliseconds
        number = number / 1000.0
    try:
        return dt.datetime.fromtimestamp(number, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None
