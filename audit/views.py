"""The compliance review pages: the audit trail, its exports, and "Verify now"."""

from __future__ import annotations

import dataclasses
import json
from typing import Any
from urllib.parse import parse_qs, urlencode

from django.contrib import messages
from django.http import HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import push_url

from audit.access import EXPORT, VERIFY, events_for_user, require_audit_permission
from audit.actions import Actor, do_record_export, do_request_chain_verification
from audit.export import chunks, proof_filters, proof_lines, streaming_response
from audit.filters import FILTER_NAMES, AuditFilterForm, page_of
from audit.models import PERSON_Q, AuditEvent, AuditHead, ChainVerification
from audit.status import latest_checkpoint, log_status
from audit.witnessing import latest_cosignature
from dashboard.http import HtmxHttpRequest

# A long list (a relay batch's record lists up to 2,000 messages) shows its first items only.
LIST_SHOWN = 10


def _text(value: Any) -> str:
    """A stored JSON value as display text (the template escapes it); a list of more than
    ``LIST_SHOWN`` items is cut, saying how many more the record holds."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) > LIST_SHOWN:
        shown = json.dumps(value[:LIST_SHOWN], sort_keys=True, ensure_ascii=False)
        more = len(value) - LIST_SHOWN
        return f"{shown[:-1]}, … {more:,} more (the whole record: export or API)]"
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class Change:
    field: str
    old: str | None
    new: str | None


@dataclasses.dataclass(frozen=True)
class EventRow:
    event: AuditEvent
    changes: list[Change]
    history_url: str
    #: The system's own event (ingest, sealing): one line, its changes folded.
    system: bool = False


def _changes(event: AuditEvent) -> list[Change]:
    """Field / old / new, from ``changes``; for an event with only a ``before`` or only an
    ``after`` (a creation or a deletion), from whichever side exists."""
    pairs: dict[str, Any]
    if isinstance(event.changes, dict):
        pairs = event.changes
    else:
        before = event.before if isinstance(event.before, dict) else {}
        after = event.after if isinstance(event.after, dict) else {}
        pairs = {k: [before.get(k), after.get(k)] for k in sorted(set(before) | set(after))}
    rows = []
    for field, pair in pairs.items():
        old, new = pair if isinstance(pair, list) and len(pair) == 2 else (None, pair)
        rows.append(
            Change(
                str(field),
                None if old is None else _text(old),
                None if new is None else _text(new),
            )
        )
    return rows


def _row(event: AuditEvent) -> EventRow:
    history = ""
    if event.target_type and event.target_id:
        query = urlencode({"target_type": event.target_type, "target_id": event.target_id})
        history = f"{reverse('audit_events')}?{query}"
    return EventRow(event, _changes(event), history, event.is_system)


def _join(*queries: str) -> str:
    return "&".join(q for q in queries if q)


@require_GET
def event_list(request: HtmxHttpRequest) -> HttpResponse:
    events = events_for_user(request)
    form = AuditFilterForm(request.GET)
    rows: list[AuditEvent] = []
    older_query = None
    # A page-only switch (not an export or API filter): hide the system's own events.
    hide_system = request.GET.get("system") == "hide"
    keep = "system=hide" if hide_system else ""
    if form.is_valid():
        selected = form.apply(events)
        if hide_system:
            selected = selected.filter(PERSON_Q)
        rows, next_before = page_of(selected, form.cursor)
        if next_before is not None:
            older_query = _join(form.querystring(before=next_before), keep)
    verification = ChainVerification.objects.first()
    head = AuditHead.objects.filter(pk=1).first()
    context = {
        "form": form,
        "rows": [_row(event) for event in rows],
        "older_query": older_query,
        "newest_query": _join(form.querystring(), keep) if request.GET.get("before") else None,
        "hide_system": hide_system,
        "filtered": any(request.GET.get(name) for name in form.fields),
        "export_query": form.querystring(),
        "contiguous": form.is_valid() and form.is_contiguous(),
        "page_query": _join(form.querystring(before=request.GET.get("before") or None), keep),
        "verification": verification,
        "behind": _behind(verification, head),
        "head": head,
        "log_status": log_status(),
        "witnessed": latest_cosignature(),
        "can_export": request.user.has_perm(EXPORT),
        "can_verify": request.user.has_perm(VERIFY),
    }
    if not request.htmx:
        return render(request, "audit/event_list.html", context)
    response = render(request, "audit/event_list.html#rows", context)
    # The history entry htmx pushes: only the filters in use, not every empty form field.
    query = _join(form.querystring(before=request.GET.get("before") or None), keep)
    return push_url(response, f"{request.path}?{query}" if query else request.path)


def _behind(verification: ChainVerification | None, head: AuditHead | None) -> int:
    """How many sealed events the last finished verification did not cover (0: it is about
    the current head). A verification is never shown as current once the log moved on."""
    if verification is None or verification.finished_at is None or head is None:
        return 0
    verified = verification.head_seq or 0
    behind = max((head.seq or 0) - verified, 0)
    if behind == 1 and AuditEvent.objects.filter(seq=verified + 1, action="audit.verify").exists():
        return 0  # the verification's own record, written after the walk
    return behind


@require_GET
def export(request: HtmxHttpRequest, fmt: str) -> HttpResponse | StreamingHttpResponse:
    """The filtered range (ignoring the page cursor), oldest first, streamed."""
    events = events_for_user(request, EXPORT)
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return HttpResponseBadRequest(
            "Invalid filters: " + form.errors.as_text(), content_type="text/plain"
        )
    upto = do_record_export(Actor.from_request(request), fmt=fmt, filters=form.active())
    pieces = chunks(form.apply(events).filter(seq__lte=upto), fmt)
    filename = f"audit-{timezone.now():%Y%m%dT%H%M%SZ}-{upto}.{fmt}"
    return streaming_response(request, pieces, filename)


@require_GET
def export_proof(request: HtmxHttpRequest) -> HttpResponse | StreamingHttpResponse:
    """``audit export --proof`` from the page: every event from ``from_seq`` (default 1) up to
    the latest signed checkpoint, in full where it matches the filters, withheld (its index
    and a digest) where not, so ``verify_export.py`` proves the export complete for them.

    It reads the checkpoint the sealer last wrote (every minute) rather than signing one in
    the request: events after it are covered by the next one."""
    events_for_user(request, EXPORT)  # the permission check (and its audited refusal)
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return HttpResponseBadRequest(
            "Invalid filters: " + form.errors.as_text(), content_type="text/plain"
        )
    checkpoint = latest_checkpoint()
    if checkpoint is None:
        return HttpResponse(
            "A proof export needs a signed checkpoint, and none is written yet: set "
            "DLO_AUDIT_SIGNING_KEY and DLO_AUDIT_CHECKPOINT_DIR (make run does), then wait a "
            "minute or run `manage.py audit checkpoint`.",
            status=409,
            content_type="text/plain",
        )
    try:
        first_seq = int(request.GET.get("from_seq") or 1)
    except ValueError:
        first_seq = 0
    if not 1 <= first_seq <= checkpoint.tree_size:
        return HttpResponseBadRequest(
            f"from_seq must be within #1–#{checkpoint.tree_size}", content_type="text/plain"
        )
    do_record_export(Actor.from_request(request), fmt="proof", filters=form.active())
    lines = proof_lines(proof_filters(form.active()), checkpoint, first_seq)
    filename = f"audit-proof-{timezone.now():%Y%m%dT%H%M%SZ}-{checkpoint.tree_size}.jsonl"
    return streaming_response(request, lines, filename)


def _filters_back(raw: str) -> str:
    """The audit page's query string to return to, rebuilt from known filter names only."""
    params = {k: v[-1] for k, v in parse_qs(raw[:2000]).items() if v}
    form = AuditFilterForm({k: params[k] for k in FILTER_NAMES if k in params})
    query = form.querystring()
    return _join(query, "system=hide" if params.get("system") == "hide" else "")


@require_POST
def verify_now(request: HtmxHttpRequest) -> HttpResponse:
    """Queue a walk of the chain, then back to the page with its filters as they were."""
    require_audit_permission(request, VERIFY)
    if do_request_chain_verification(Actor.from_request(request)):
        messages.success(
            request,
            "Chain verification queued. Its result appears under “Chain verification” "
            "when the walk finishes.",
        )
    else:
        messages.info(request, "A chain verification is already running.")
    back = _filters_back(request.POST.get("filters", ""))
    return redirect(f"{reverse('audit_events')}?{back}" if back else reverse("audit_events"))
