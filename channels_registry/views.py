"""Read-only registry pages: the channel list and the channel page."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from channels_registry.access import channels_for_user, get_channel_for_user
from channels_registry.models import Broker
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
def channel_detail(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    channel = get_channel_for_user(request, slug)
    context = {
        "channel": channel,
        "errors": [f for f in channel.findings if f["severity"] == "error"],
        "warnings": [f for f in channel.findings if f["severity"] != "error"],
        "can_edit": request.user.has_perm("channels_registry.change_channel"),
    }
    return render(request, "channels_registry/channel_detail.html", context)
