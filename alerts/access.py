"""The one access helper per object type, used by every alert view."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import get_object_or_404

from alerts.models import Alert

VIEW_PERMISSION = "alerts.view_alert"
ACK_PERMISSION = "alerts.ack_alert"
SILENCE_PERMISSION = "alerts.add_silence"
EXPIRE_PERMISSION = "alerts.change_silence"


def alerts_for_user(request: HttpRequest) -> QuerySet[Alert]:
    if not request.user.has_perm(VIEW_PERMISSION):
        raise PermissionDenied("You need the viewer role to see alerts.")
    return Alert.objects.select_related("broker", "channel", "silence", "acknowledged_by")


def get_alert_for_user(request: HttpRequest, pk: int) -> Alert:
    return get_object_or_404(alerts_for_user(request), pk=pk)
