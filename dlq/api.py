"""``GET /api/dead-letters/``: the list's filters, cursor pagination, redacted payloads.

The API never reveals: payloads of channels with redaction rules come back redacted for every
caller (a reveal is an audited action in the UI, with a reason). ``body_base64`` is the raw
body when the channel has no body rules, the redacted re-serialized JSON when it has, and
``null`` when the rules cannot be applied or the payload was purged.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_http_methods

from dashboard.api import api_error, api_view
from dlq import redaction, render
from dlq.access import entries_for_user, get_plan_for_user, plans_for_user, require_action
from dlq.filters import MAX_PAGE_SIZE, PAGE_SIZE, EntryFilter, keyset_page, parse_id
from dlq.models import DeadLetter

PREVIEW_CHARS = 1000


def serialize(entry: DeadLetter) -> dict[str, Any]:
    channel = entry.channel
    redact = redaction.has_rules(channel)
    raw = entry.body if entry.body is None else bytes(entry.body)
    shown = render.redacted_body_bytes(raw, channel) if redact else raw
    preview: str | None = None
    if shown is not None:
        try:
            preview = render.visible(shown[: PREVIEW_CHARS * 4].decode("utf-8")[:PREVIEW_CHARS])
        except UnicodeDecodeError:
            preview = None
    headers = redaction.redact_headers(entry.headers, channel) if redact else entry.headers
    return {
        "id": entry.pk,
        "url": entry.get_absolute_url(),
        "channel": channel.slug,
        "source": entry.source,
        "status": entry.status,
        "group": entry.group_id,
        "parent": entry.parent_id,
        "dedupe_key": entry.dedupe_key,
        "reason": entry.reason,
        "error_class": entry.error_class,
        "error_message": entry.error_message,
        "redelivery_count": entry.redelivery_count,
        "first_death_queue": entry.first_death_queue,
        "first_death_exchange": entry.first_death_exchange,
        "first_death_at": entry.first_death_at,
        "dead_lettered_at": entry.dead_lettered_at,
        "ingested_at": entry.ingested_at,
        "idempotency_key": entry.idempotency_key,
        "missing_idempotency_key": entry.missing_idempotency_key,
        "schema_version": entry.schema_version,
        "is_parseable": entry.is_parseable,
        "content_type": entry.content_type,
        "size": entry.size,
        "body_sha256": entry.body_sha256,
        "redacted": redact,
        "body_base64": base64.b64encode(shown).decode("ascii") if shown is not None else None,
        "text_preview": preview,
        "headers": headers,
        "properties": entry.properties,
        "death_history": entry.death_history,
        "purged_at": entry.purged_at,
    }


@api_view
@require_GET
def dead_letter_list(request: HttpRequest) -> HttpResponse:
    entries_visible = entries_for_user(request)
    f = EntryFilter.from_params(request.GET)
    try:
        size = min(max(int(request.GET.get("limit", PAGE_SIZE)), 1), MAX_PAGE_SIZE)
    except ValueError:
        return api_error(400, "limit must be an integer")
    after = request.GET.get("after", "")
    after_id = parse_id(after)
    if after and after_id is None:
        return api_error(400, "after must be an entry id")
    entries = f.apply(entries_visible.select_related("channel"))
    page = keyset_page(entries, after_id, size)
    next_url = None
    if page.next_after:
        next_url = request.build_absolute_uri(
            reverse("dead_letter_api") + "?" + f.query_string(after=page.next_after, limit=size)
        )
    return JsonResponse(
        {
            "results": [serialize(e) for e in page.rows],
            "next": next_url,
            "filters": f.params(),
            "warnings": f.errors,
        }
    )


urlpatterns = [path("", dead_letter_list, name="dead_letter_api")]


# -- /api/replay-plans/ ----------------------------------------------------------------------


def serialize_plan(plan: Any) -> dict[str, Any]:
    return {
        "id": plan.pk,
        "url": plan.get_absolute_url(),
        "kind": plan.kind,
        "status": plan.status,
        "channel": plan.channel.slug,
        "target": plan.target_display or None,
        "total": plan.total,
        "velocity": plan.velocity,
        "canary_size": plan.canary_size,
        "sent": plan.sent,
        "sent_entries": plan.sent_entries,
        "maybe_twice": plan.maybe_twice,
        "outages": plan.outages,
        "waiting_since": plan.waiting_since,
        "confirmed": plan.confirmed,
        "failed": plan.failed,
        "cancelled": plan.cancelled,
        "discarded": plan.discarded,
        "pending": plan.pending,
        "warnings": plan.warnings,
        "override": plan.override,
        "needs_approval": plan.needs_approval,
        "requested_by": plan.requested_by_username,
        "approved_by": plan.approved_by_username or None,
        "reason": plan.reason,
        "selection": plan.selection,
        "created_at": plan.created_at,
        "started_at": plan.started_at,
        "finished_at": plan.finished_at,
        "status_note": plan.status_note,
    }


def _create_plan(request: HttpRequest) -> HttpResponse:
    from audit.actions import Actor
    from dlq.actions import PlanRefused, do_create_plan
    from dlq.models import PlanKind
    from dlq.preview import DEFAULT_VELOCITY, MAX_VELOCITY, Selection, build_preview

    try:
        data = json.loads(request.body or b"{}")
    except ValueError:
        return api_error(400, "the body must be a JSON object")
    if not isinstance(data, dict):
        return api_error(400, "the body must be a JSON object")
    kind = data.get("kind", PlanKind.REPLAY)
    if kind not in PlanKind.values:
        return api_error(400, "kind must be replay or discard")
    require_action(request, kind, f"{kind} via API")  # audited denial, then a JSON 403
    raw_filter = data.get("filter") or {}
    if not isinstance(raw_filter, dict):
        return api_error(400, "filter must be an object of the list's filter parameters")
    params = {k: str(v) for k, v in raw_filter.items()}
    for key in ("channel", "group"):
        if data.get(key) is not None:
            params[key] = str(data[key])
    ids = data.get("ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return api_error(400, "ids must be a list of entry ids")
    selection = Selection(EntryFilter.from_params(params), sorted(set(ids)))
    entries = entries_for_user(request)
    if data.get("preview"):
        return JsonResponse(build_preview(kind, selection, entries).as_json())
    options: dict[str, Any] = {}
    if kind == PlanKind.REPLAY:
        try:
            options = {
                "velocity": float(data.get("rate") or DEFAULT_VELOCITY),
                "canary_size": int(data.get("canary_size") or 0),
                "canary_wait_s": float(data.get("canary_wait_s") or 30.0),
                "override": bool(data.get("override_reason")),
                "override_reason": str(data.get("override_reason") or ""),
            }
        except (TypeError, ValueError):
            return api_error(400, "rate, canary_size and canary_wait_s must be numbers")
        if not 0 < options["velocity"] <= MAX_VELOCITY:
            return api_error(400, f"rate must be in (0, {MAX_VELOCITY:g}]")
        # The same bounds as the page's form; NaN and Infinity (which JSON parsing accepts)
        # would otherwise reach the relay's timedelta arithmetic and fail every run.
        if not 0 <= options["canary_size"] <= 10_000:
            return api_error(400, "canary_size must be in [0, 10000]")
        if not 1 <= options["canary_wait_s"] <= 3600:
            return api_error(400, "canary_wait_s must be in [1, 3600]")
    try:
        plan, created = do_create_plan(
            kind,
            selection,
            entries,
            actor=Actor.from_request(request),
            reason=str(data.get("reason") or ""),
            request_key=str(data.get("request_key") or "")[:64] or None,
            **options,
        )
    except PlanRefused as exc:
        return api_error(400, str(exc))
    return JsonResponse(serialize_plan(plan), status=201 if created else 200)


@api_view
@require_http_methods(["GET", "POST"])
def replay_plan_list(request: HttpRequest) -> HttpResponse:
    """GET: plans, newest first (``?status=``, ``?after=<id>``). POST: freeze a plan (the same
    rules as the page: reason, override, four eyes; ``"preview": true`` only previews)."""
    from dlq.models import PlanStatus

    if request.method == "POST":
        return _create_plan(request)
    plans = plans_for_user(request).order_by("-id")
    status = request.GET.get("status", "")
    if status:
        if status not in PlanStatus.values:
            return api_error(400, "unknown status")
        plans = plans.filter(status=status)
    after = request.GET.get("after", "")
    if after:
        after_id = parse_id(after)
        if after_id is None:
            return api_error(400, "after must be a plan id")
        plans = plans.filter(pk__lt=after_id)
    rows = list(plans[: PAGE_SIZE + 1])
    next_url = None
    if len(rows) > PAGE_SIZE:
        next_url = request.build_absolute_uri(
            reverse("replay_plan_api") + f"?after={rows[PAGE_SIZE - 1].pk}"
            + (f"&status={status}" if status else "")
        )  # fmt: skip
    return JsonResponse({"results": [serialize_plan(p) for p in rows[:PAGE_SIZE]],
                         "next": next_url})  # fmt: skip


@api_view
@require_GET
def replay_plan_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse(serialize_plan(get_plan_for_user(request, pk)))


plan_urlpatterns = [
    path("", replay_plan_list, name="replay_plan_api"),
    path("<int:pk>/", replay_plan_detail, name="replay_plan_api_detail"),
]
