"""Triage pages: failure groups, the filtered entry list, the entry page, reveal, download."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db.models import Q, QuerySet
from django.db.models.functions import Substr
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from audit.actions import Actor
from audit.models import AuditEvent
from channels_registry.access import channels_for_user
from dashboard.html import channel_filter
from dashboard.http import HtmxHttpRequest
from dlq.capture import trends
from dlq.models import DeadLetter, ReplayItem, ReplayPlan, Source, Status
from dlq.models.plans import outcome_line
from dlq.text import redaction
from dlq.text import render as body_render
from dlq.triage.access import (
    can_reveal,
    entries_for_user,
    get_entry_for_user,
    groups_for_user,
    require_reveal,
)
from dlq.triage.actions import do_record_download, do_reveal_entry
from dlq.triage.entries_html import entry_rows_html
from dlq.triage.filters import PAGE_SIZE, EntryFilter, first_page, keyset_page, parse_id
from dlq.triage.groups_html import GROUP_FIELDS, Group, group_rows_html
from dlq.triage.lineage import lineage_context

GROUPS_SHOWN = 200
#: What an entry list row shows (``dlq.triage.entries_html``): never the body (up to 1 MiB), headers
#: or search text, and of the channel only its slug and retention (the eviction warning).
ENTRY_ROW_FIELDS = (
    "channel__slug", "channel__retention_s", "source", "state__status", "message_type", "reason",
    "error_class", "error_message", "idempotency_key", "missing_idempotency_key",
    "dead_lettered_at", "ingested_at", "size", "generation", "parent_id", "purged_at",
)  # fmt: skip


def _group_rows(shown: list[Group]) -> list[dict[str, Any]]:
    """The shown groups with their stored trend and the first 200 characters of their
    sample's error (cut in SQL: an error message may be long)."""
    samples = dict(
        DeadLetter.objects.filter(pk__in=[g.sample_id for g in shown if g.sample_id])
        .annotate(head=Substr("error_message", 1, 200))
        .values_list("id", "head")
    )
    counts = trends.trends([g.id for g in shown], timezone.now())
    rows = []
    for g in shown:
        recent, previous = counts.get(g.id, (0, 0))
        sample = samples.get(g.sample_id, "") if g.sample_id else ""
        rows.append(
            {
                "group": g,
                "recent": recent,
                "previous": previous,
                "trend": "up" if recent > previous else ("down" if recent < previous else "flat"),
                "sample": body_render.visible(sample),
            }
        )
    return rows


def _unknown_channel(request: HtmxHttpRequest, slug: str) -> bool:
    """Whether the channel filter names no channel (a mistyped slug in the search field the
    filter becomes past ``CHANNEL_SELECT_MAX`` channels): the empty state says so."""
    return bool(slug) and not channels_for_user(request).filter(slug=slug).exists()


@require_GET
def group_list(request: HtmxHttpRequest) -> HttpResponse:
    groups = groups_for_user(request).filter(count__gt=0)
    channel = request.GET.get("channel", "")[:100]
    if channel:
        groups = groups.filter(channel__slug=channel)
    # Open groups first (what needs triage), walked and cut along ``dlq_group_triage_order``.
    # Samples are fetched for the shown groups only: joined in the query, PostgreSQL looked
    # up the sample of every group before sorting.
    ordered = groups.order_by("-open_count", "-last_seen", "-id").values_list(*GROUP_FIELDS)
    shown = [Group._make(values) for values in ordered[: GROUPS_SHOWN + 1]]
    rows = _group_rows(shown[:GROUPS_SHOWN])
    context: dict[str, Any] = {
        "rows": rows,
        "rows_html": group_rows_html(rows),
        "more": len(shown) > GROUPS_SHOWN,
        "channel": channel,
        "unknown_channel": _unknown_channel(request, channel),
    }
    template = "dlq/group_list.html"
    if request.htmx and not request.htmx.boosted:
        template += "#groups"
    else:  # the filter form is outside the partial
        slugs = channels_for_user(request).order_by("slug").values_list("slug", flat=True)
        context["channel_filter"] = channel_filter(slugs, channel)
    return render(request, template, context)


def _row_columns(entries: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
    """Only what a row shows: never 50 bodies (up to 1 MiB each), headers or search text."""
    return entries.select_related("channel", "state").only(*ENTRY_ROW_FIELDS)


@require_GET
def entry_list(request: HtmxHttpRequest) -> HttpResponse:
    f = EntryFilter.from_params(request.GET)
    after_id = parse_id(request.GET.get("after", ""))
    entries = _row_columns(f.apply(entries_for_user(request)))
    total = None
    if after_id:  # a continued page: no count
        page = keyset_page(entries, after_id, PAGE_SIZE)
    else:
        page, total = first_page(entries, f, PAGE_SIZE, _row_columns(DeadLetter.objects.all()))
    now = timezone.now()
    rows = [(e, e.near_eviction(now)) for e in page.rows]
    can_bulk = request.user.has_perm("dlq.replay_deadletter") or request.user.has_perm(
        "dlq.discard_deadletter"
    )
    context: dict[str, Any] = {
        "f": f,
        "page": page,
        "rows": rows,
        "rows_html": entry_rows_html(rows, f.channel, can_bulk),
        "total": total,
        "next_qs": f.query_string(after=page.next_after) if page.next_after else "",
        "first_qs": f.query_string(),
        "sources": Source.choices,
        "statuses": Status.choices,
        "group": groups_for_user(request).filter(pk=f.group).first() if f.group else None,
        "paged": after_id is not None,
        "can_bulk": can_bulk,
        "unknown_channel": _unknown_channel(request, f.channel),
    }
    template = "dlq/entry_list.html"
    if request.htmx and not request.htmx.boosted:
        template += "#results"
    else:  # the filter form is outside the partial
        slugs = channels_for_user(request).order_by("slug").values_list("slug", flat=True)
        context["channel_filter"] = channel_filter(slugs, f.channel)
    return render(request, template, context)


HISTORY_SHOWN = 100
HISTORY_PLANS = 20


def entry_history(entry: DeadLetter) -> list[AuditEvent]:
    """The entry's audit events and, for the plans that held it (the newest
    ``HISTORY_PLANS``), the request of the chunk it was frozen in and the relay batch's record
    of its outcome: a plan audits its request once per chunk (``dlq.plans.freeze``) and its
    outcomes once per relay batch (``dlq.plans.relay_outcomes``), not once per entry
    (``outcome_line`` reads this entry's line of such a record). Newest first, at most
    ``HISTORY_SHOWN``."""
    shown = Q(target_type="dlq.deadletter", target_id=str(entry.pk))
    items = ReplayItem.objects.filter(entry=entry).select_related("plan").order_by("-id")
    for item in items[:HISTORY_PLANS]:
        shown |= Q(
            target_type=ReplayPlan._meta.label_lower,
            target_id=str(item.plan_id),
            action=f"dlq.{item.plan.kind}.request",
            after__first_position__lte=item.position,
            after__last_position__gte=item.position,
        )
        if item.outcome_event_id is not None:
            shown |= Q(pk=item.outcome_event_id)
    return list(
        AuditEvent.objects.filter(shown)
        .defer("detail_json", "before", "changes")
        .order_by("-seq", "-id")[:HISTORY_SHOWN]
    )


def _detail_context(request: HtmxHttpRequest, entry: DeadLetter, revealed: bool) -> dict[str, Any]:
    channel = entry.channel
    redact = redaction.has_rules(channel) and not revealed
    headers = redaction.redact_headers(entry.headers, channel) if redact else entry.headers
    header_rows, headers_hidden = body_render.header_rows(headers)
    body = entry.body if entry.body is None else bytes(entry.body)
    rendered = body_render.render_body(body, channel, redact=redact)
    history = [(e, outcome_line(e.action, e.after, entry.pk)) for e in entry_history(entry)]
    return {
        "entry": entry,
        "channel": channel,
        "body": rendered,
        "header_rows": header_rows,
        "headers_hidden": headers_hidden,
        "properties": body_render.property_rows(entry.properties or {}),
        "timeline": body_render.timeline(entry.death_history or []),
        "history": history,
        "redacted": redact,
        # The headers' badge only when a header was actually masked, not for every channel
        # with rules (a body rule alone masks no header).
        "headers_redacted": redact and headers != entry.headers,
        "revealed": revealed,
        "can_reveal": can_reveal(request.user) and redaction.has_rules(channel),
        "can_download": entry.body is not None
        and (not redaction.has_rules(channel) or can_reveal(request.user)),
        "near_eviction": entry.near_eviction(),
        "eviction_at": entry.eviction_at(),
        "error_message": body_render.visible(entry.error_message[:5000]),
        **lineage_context(request, entry),
    }


@require_GET
def entry_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    entry = get_entry_for_user(request, pk)
    return render(request, "dlq/entry_detail.html", _detail_context(request, entry, False))


@require_POST
def entry_reveal(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Show the redacted fields, audited. Rendered in the POST response on purpose: a reveal
    is for this one look, never remembered in the session or a redirect URL."""
    entry = get_entry_for_user(request, pk)
    require_reveal(request, entry, "reveal")
    reason = request.POST.get("reason", "").strip()
    if not reason:
        messages.error(request, "Give a reason to reveal redacted fields.")
        context = _detail_context(request, entry, False)
        return render(request, "dlq/entry_detail.html", context, status=400)
    do_reveal_entry(entry, Actor.from_request(request), reason[:1000])
    return render(request, "dlq/entry_detail.html", _detail_context(request, entry, True))


@require_GET
def entry_download(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The raw body bytes as an attachment, never with the message's own content type. On a
    channel with redaction rules only for users with the reveal permission, and audited."""
    entry = get_entry_for_user(request, pk)
    if entry.body is None:
        raise Http404("The payload was purged by the retention policy.")
    if redaction.has_rules(entry.channel):
        require_reveal(request, entry, "download")
        do_record_download(entry, Actor.from_request(request))
    response = HttpResponse(bytes(entry.body), content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="dead-letter-{entry.pk}.bin"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "private, no-store"
    return response
