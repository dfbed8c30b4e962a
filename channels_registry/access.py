"""The one access helper per object type, used by every view."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import get_object_or_404

from channels_registry.models import Channel


def channels_for_user(request: HttpRequest) -> QuerySet[Channel]:
    if not request.user.has_perm("channels_registry.view_channel"):
        raise PermissionDenied("You need the viewer role to see channels.")
    return Channel.objects.select_related("broker")


def get_channel_for_user(request: HttpRequest, slug: str) -> Channel:
    return get_object_or_404(channels_for_user(request), slug=slug)
