"""Read-only registry pages: the channel list and the channel page."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from channels_registry.access import channels_for_user, get_channel_for_user
from channels_registry.charts import channel_charts, parse_window
from channels_registry.models import Broker, Channel
from channels_registry.principles import PRINCIPLES, SEED_DEFAULTS
from channels_registry.retries import read_retries
from channels_registry.visibility import management_notes
from dashboard.http import HtmxHttpRequest


@require_GET
def channel_list(request: HtmxHttpRequest) -> HttpResponse:
    channels = channels_for_user(request).order_by("slug")
    team = request.GET.get("team", "")
    broker = request.GET.get("broker", "")
    query = request.GET.get("q", "").strip()
    if team:
        channels = channels.filter(owner_team=team)
    if broker:
        channels = channels.filter(broker__name=broker)
    if query:
        channels = channels.filter(
            Q(name__icontains=query) | Q(slug__icontains=query) | Q(address__icontains=query)
        )
    page = Paginator(channels, 100).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "filters": {"team": team, "broker": broker, "q": query},
        "teams": channels_for_user(request)
        .exclude(owner_team="")
        .order_by("owner_team")
        .values_list("owner_team", flat=True)
        .distinct(),
        "brokers": Broker.objects.order_by("name").values_list("name", flat=True),
        "can_declare": request.user.has_perm("channels_registry.add_channel"),
    }
    template = "channels_registry/channel_list.html"
    if request.htmx:
        template += "#results"
    return render(request, template, context)


@require_GET
def principles(request: HtmxHttpRequest) -> HttpResponse:
    """The glossary of P1–P10 that every finding links to, and the seeds' defaults."""
    defaults = [
        (name, label, ", ".join(value) if isinstance(value, list) else value, why)
        for name, label, value, why in SEED_DEFAULTS
    ]
    context = {"principles": PRINCIPLES.values(), "seed_defaults": defaults}
    return render(request, "channels_registry/principles.html", context)


@require_GET
def channel_detail(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    channel = get_channel_for_user(request, slug)
    window, window_error = parse_window(request.GET, timezone.now())
    context = {
        "channel": channel,
        "errors": [f for f in channel.findings if f["severity"] == "error"],
        "warnings": [f for f in channel.findings if f["severity"] != "error"],
        "can_edit": request.user.has_perm("channels_registry.change_channel"),
        **live_health_context(channel, request.GET.get("range", "1h"), window),
        "window_error": window_error,
    }
    return render(request, "channels_registry/channel_detail.html", context)


@require_GET
def channel_retries(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """Messages waiting to retry, read from the broker now (one bounded call); the channel
    page loads it into its section with htmx, the plain link shows it as a page."""
    channel = get_channel_for_user(request, slug)
    context = {"channel": channel, "retries": read_retries(channel)}
    template = "channels_registry/channel_retries.html"
    if request.htmx:
        template += "#retries"
    return render(request, template, context)


#: Builds the board's row for one channel: the channel page shows its state as the board does.
#: Registered by the board's app (``DashboardConfig.ready``), the layer above this one.
BoardRowBuilder = Callable[[Channel, dt.datetime], Any]
_board_row: BoardRowBuilder | None = None


def register_board_row(build: BoardRowBuilder | None) -> None:
    global _board_row
    _board_row = build


def live_health_context(
    channel: Channel, range_key: str, window: tuple[float, float] | None = None
) -> dict[str, Any]:
    """The channel page's health section: current state (as the board shows it), charts and
    the declared-vs-observed findings."""
    if _board_row is None:
        raise RuntimeError("The health board (the dashboard app) is not installed.")
    channel = Channel.objects.select_related("broker", "health").get(pk=channel.pk)
    health = getattr(channel, "health", None)
    return {
        "health_row": _board_row(channel, timezone.now()),
        "broker_problems": channel.broker.config_problems(),
        "management_notes": management_notes(channel.broker),
        "observed_findings": health.observed_findings if health else [],
        "observed_at": health.observed_at if health else None,
        **channel_charts(channel, range_key, window),
    }
