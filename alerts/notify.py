"""Notification delivery: at-least-once, grouped per broker, retried with capped backoff.

``do_deliver_notifications(now)`` is run by a periodic task (every 5 s) and right after an
evaluation queues rows. For each (destination, broker) group with a due row:

1. Recover rows whose sender died mid-send (lease expired): they become due again. This is
   the "at least" in at-least-once; receivers deduplicate on ``dedupe_key``.
2. Claim the group's pending rows with one conditional UPDATE (``status=pending`` →
   ``sending`` with a fresh batch id and a lease): two workers never send the same row.
3. Build one message for the whole batch (JSON webhook signed with HMAC-SHA256, Slack text,
   or an email) and send it with a timeout, outside any transaction.
4. Record the attempt as a ``DeliveryAttempt`` row; mark the rows sent, or schedule a retry
   with capped exponential backoff and full jitter, or — once the retry budget (attempts or
   age) is spent, or on a permanent error such as HTTP 400/401/404 — mark them failed. The
   alert page shows every row's status and last error.

A sent row is never claimed again, and rows are unique per (alert, transition, destination),
so a transition is sent to a destination once (or, after a crash mid-send, at worst again
with the same dedupe keys).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import logging
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from alerts.models import (
    DeliveryAttempt,
    Destination,
    DestinationKind,
    EvaluatorState,
    Notification,
    NotificationStatus,
    Transition,
)
from dashboard.egress import EgressRefused, pinned_target

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-DLO-Signature"
DELIVERY_HEADER = "X-DLO-Delivery"
PAYLOAD_VERSION = "1"
# Retry policy: 10 s doubling to a 15 min cap, full jitter; at most 8 attempts within 6 h.
BACKOFF_BASE_S = 10.0
BACKOFF_CAP_S = 900.0
MAX_ATTEMPTS = 8
MAX_AGE = dt.timedelta(hours=6)
LEASE = dt.timedelta(seconds=60)
HTTP_TIMEOUT_S = 5.0
MAX_GROUPS_PER_RUN = 100


class DeliveryError(Exception):
    def __init__(self, message: str, *, permanent: bool = False, status: int | None = None):
        super().__init__(message)
        self.permanent = permanent
        self.status = status


@dataclasses.dataclass
class DeliveryResult:
    messages: int = 0
    sent: int = 0
    retrying: int = 0
    failed: int = 0

    def summary(self) -> str:
        return (
            f"{self.messages} message(s): {self.sent} notification(s) sent,"
            f" {self.retrying} to retry, {self.failed} failed"
        )


def backoff_s(attempts: int, rng: random.Random | None = None) -> float:
    """Delay before the next attempt after ``attempts`` failed ones: full jitter over a capped
    exponential (10 s, 20 s, 40 s … 15 min), never under 1 s."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(0, attempts - 1))
    return max(1.0, (rng or random).uniform(ceiling / 2, ceiling))


def sign(secret: str, body: bytes) -> str:
    """The signature header value: ``sha256=<hex HMAC-SHA256 of the body>``."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str) -> bool:
    return hmac.compare_digest(sign(secret, body), header)


def absolute_url(path: str) -> str:
    """``path`` under ``DLO_BASE_URL`` (the address people open the dashboard at)."""
    base = str(getattr(settings, "DLO_BASE_URL", "") or "").rstrip("/")
    return base + path


def alert_payload(n: Notification) -> dict[str, Any]:
    a = n.alert
    return {
        "notification_id": n.pk,
        "dedupe_key": f"{a.pk}:{n.transition}",
        "alert_id": a.pk,
        "transition": n.transition,
        "status": a.state,
        "rule": a.rule,
        "severity": a.severity,
        "broker": a.broker.name,
        "channel": a.channel.slug if a.channel else None,
        "channel_name": a.channel.name if a.channel else None,
        "owner_team": a.channel.owner_team if a.channel else None,
        "summary": a.summary,
        "value": a.value,
        "threshold": a.threshold,
        "started_at": a.started_at.isoformat(),
        "fired_at": a.fired_at.isoformat() if a.fired_at else None,
        "resolved_at": a.resolved_at.isoformat() if a.resolved_at else None,
        "evidence": a.evidence if n.transition == Transition.FIRING else a.resolve_evidence,
        "runbook_url": (a.channel.runbook_url or None) if a.channel else None,
        "url": absolute_url(a.get_absolute_url()),
    }


def message_payload(batch: str, rows: Sequence[Notification], now: dt.datetime) -> dict[str, Any]:
    """The JSON webhook body (documented in docs/alerting.md)."""
    firing = [r for r in rows if r.transition == Transition.FIRING]
    return {
        "version": PAYLOAD_VERSION,
        "delivery_id": batch,
        "status": "firing" if firing else "resolved",
        "broker": rows[0].alert.broker.name,
        "sent_at": now.isoformat(),
        "firing": len(firing),
        "resolved": len(rows) - len(firing),
        "alerts": [alert_payload(r) for r in rows],
    }


def _lines(rows: Sequence[Notification]) -> list[str]:
    lines = []
    for r in rows:
        a = r.alert
        mark = "FIRING" if r.transition == Transition.FIRING else "RESOLVED"
        lines.append(
            f"[{mark}] {a.severity} {a.get_rule_display()} · {a.subject}: {a.summary}"
            f" — {absolute_url(a.get_absolute_url())}"
        )
    return lines


def _title(rows: Sequence[Notification]) -> str:
    firing = sum(1 for r in rows if r.transition == Transition.FIRING)
    broker = rows[0].alert.broker.name
    parts = []
    if firing:
        parts.append(f"{firing} firing")
    if len(rows) - firing:
        parts.append(f"{len(rows) - firing} resolved")
    return f"Dead Letter Office · {broker}: {', '.join(parts)}"


def slack_escape(text: str) -> str:
    """Slack's control characters escaped, so names and summaries (a requester's name, a
    reason, a broker's evidence) cannot mention ``<!channel>`` or forge a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(
    dest: Destination, batch: str, rows: Sequence[Notification], now: dt.datetime
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers of one webhook message."""
    if dest.kind == DestinationKind.SLACK:
        text = "*" + slack_escape(_title(rows)) + "*\n" + slack_escape("\n".join(_lines(rows)))
        return json.dumps({"text": text}).encode("utf-8"), {"Content-Type": "application/json"}
    body = json.dumps(message_payload(batch, rows, now), sort_keys=True).encode("utf-8")
    headers = {
        "Content-Type": "application/json",
        DELIVERY_HEADER: batch,
        SIGNATURE_HEADER: sign(dest.secret, body),
    }
    return body, headers


def _post(dest: Destination, body: bytes, headers: dict[str, str]) -> int:
    try:
        url, host = pinned_target(dest.url)
    except EgressRefused as exc:
        raise DeliveryError(f"refused: {exc}"[:300], permanent=True) from None
    except ValueError as exc:  # a malformed port or IPv6 literal
        raise DeliveryError(f"invalid URL: {exc}"[:300], permanent=True) from None
    sni = urlsplit(dest.url).hostname or ""
    try:
        with httpx.Client(timeout=HTTP_TIMEOUT_S, follow_redirects=False) as client:
            response = client.post(
                url,
                content=body,
                headers={**headers, "User-Agent": "dead-letter-office", "Host": host},
                extensions={"sni_hostname": sni},
            )
    except httpx.InvalidURL as exc:
        # Not an httpx.HTTPError; a URL saved before validation can only be fixed by a person.
        raise DeliveryError(f"invalid URL: {exc}"[:300], permanent=True) from exc
    except httpx.HTTPError as exc:
        raise DeliveryError(f"{type(exc).__name__}: {exc}"[:300]) from exc
    if response.status_code >= 300:
        # Retrying cannot fix a bad request, a refused credential or a wrong URL.
        permanent = 400 <= response.status_code < 500 and response.status_code not in (
            408,
            425,
            429,
        )
        raise DeliveryError(
            f"HTTP {response.status_code}", permanent=permanent, status=response.status_code
        )
    return response.status_code


def _email(dest: Destination, rows: Sequence[Notification]) -> None:
    body = "\n".join(_lines(rows)) + "\n"
    for r in rows:
        evidence = r.alert.evidence if r.transition == Transition.FIRING else []
        if evidence:
            body += f"\n{r.alert.subject} · {r.alert.get_rule_display()}:\n"
            body += "".join(f"  - {line}\n" for line in evidence)
    try:
        connection = get_connection(timeout=HTTP_TIMEOUT_S * 2)
        EmailMessage(
            subject=_title(rows),
            body=body,
            to=dest.recipients(),
            connection=connection,
            headers={"X-DLO-Delivery": rows[0].batch},
        ).send(fail_silently=False)
    except Exception as exc:  # SMTP errors of every kind are a failed attempt, retried
        raise DeliveryError(f"{type(exc).__name__}: {exc}"[:300]) from exc


def send(
    dest: Destination, batch: str, rows: Sequence[Notification], now: dt.datetime
) -> int | None:
    """Send one message; returns the HTTP status (None for email). Raises ``DeliveryError``."""
    if dest.kind == DestinationKind.EMAIL:
        _email(dest, rows)
        return None
    body, headers = render(dest, batch, rows, now)
    return _post(dest, body, headers)


def do_deliver_notifications(now: dt.datetime | None = None) -> DeliveryResult:
    """Send every due group (see the module docstring). Safe to run concurrently."""
    now = now or timezone.now()
    result = DeliveryResult()
    # 1. Recover abandoned sends.
    Notification.objects.filter(status=NotificationStatus.SENDING, lease_until__lt=now).update(
        status=NotificationStatus.PENDING, next_attempt_at=now, lease_until=None
    )
    groups = list(
        Notification.objects.filter(status=NotificationStatus.PENDING, next_attempt_at__lte=now)
        .values_list("destination_id", "group_key")
        .distinct()
        .order_by("destination_id", "group_key")[:MAX_GROUPS_PER_RUN]
    )
    for destination_id, group_key in groups:
        _deliver_group(destination_id, group_key, now, result)
    return result


def _deliver_group(
    destination_id: int, group_key: str, now: dt.datetime, result: DeliveryResult
) -> None:
    # 2. Claim: the due rows, plus fresh rows of the same group still inside their grouping
    # wait (they ride along: one message per broker).
    batch = uuid.uuid4().hex
    claimed = (
        Notification.objects.filter(
            destination_id=destination_id,
            group_key=group_key,
            status=NotificationStatus.PENDING,
        )
        .filter(Q(next_attempt_at__lte=now) | Q(attempts=0))
        .update(status=NotificationStatus.SENDING, batch=batch, lease_until=now + LEASE)
    )
    if not claimed:
        return
    rows = list(
        Notification.objects.filter(batch=batch, status=NotificationStatus.SENDING)
        .select_related("alert", "alert__broker", "alert__channel", "destination")
        .order_by("alert__channel__slug", "alert_id", "transition")
    )
    if not rows:
        return
    dest = rows[0].destination
    # 3. Send, outside any transaction.
    started = time.monotonic()
    error: DeliveryError | None = None
    status: int | None = None
    try:
        status = send(dest, batch, rows, now)
    except DeliveryError as exc:
        error = exc
    duration_ms = round((time.monotonic() - started) * 1000)
    result.messages += 1
    # 4. Record.
    with transaction.atomic():
        DeliveryAttempt.objects.create(
            destination=dest,
            batch=batch,
            started_at=now,
            duration_ms=duration_ms,
            ok=error is None,
            status_code=error.status if error else status,
            error=str(error)[:500] if error else "",
            notifications=[r.pk for r in rows],
        )
        sent = failed = 0
        if error is None:
            sent = Notification.objects.filter(
                batch=batch, status=NotificationStatus.SENDING
            ).update(
                status=NotificationStatus.SENT,
                sent_at=now,
                attempts=F("attempts") + 1,
                last_error="",
                lease_until=None,
            )
            result.sent += sent
        else:
            log.warning("delivery %s to %s failed: %s", batch, dest.name, error)
            for row in rows:
                attempts = row.attempts + 1
                spent = attempts >= MAX_ATTEMPTS or now - row.created_at >= MAX_AGE
                updates: dict[str, Any] = {
                    "attempts": attempts,
                    "last_error": str(error)[:500],
                    "lease_until": None,
                }
                if error.permanent or spent:
                    updates["status"] = NotificationStatus.FAILED
                    failed += 1
                else:
                    updates["status"] = NotificationStatus.PENDING
                    updates["next_attempt_at"] = now + dt.timedelta(seconds=backoff_s(attempts))
                    result.retrying += 1
                Notification.objects.filter(pk=row.pk, batch=batch).update(**updates)
            result.failed += failed
        EvaluatorState.objects.get_or_create(pk=1)
        EvaluatorState.objects.filter(pk=1).update(
            delivery_attempts=F("delivery_attempts") + 1,
            delivery_errors=F("delivery_errors") + (1 if error else 0),
            notifications_sent=F("notifications_sent") + sent,
            notifications_failed=F("notifications_failed") + failed,
        )
