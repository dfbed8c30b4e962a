"""The one access helper per object type, used by every alert view."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import get_object_or_404

from alerts.models import Alert
from audit.actions import Actor, do_record_denial

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


#: The audited action named when each permission is refused (the success's action name).
_DENIED_ACTION = {
    ACK_PERMISSION: "alert.acknowledge",
    SILENCE_PERMISSION: "alert.silence",
    EXPIRE_PERMISSION: "alert.silence.expire",
}


def require_alert_permission(
    request: HttpRequest, permission: str, *, target_type: str, target_repr: str, message: str
) -> None:
    """Return if the user has ``permission``; otherwise record the denial (who tried what,
    from where) and raise 403, as the dead-letter and audit pages do."""
    if request.user.has_perm(permission):
        return
    do_record_denial(
        _DENIED_ACTION[permission],
        actor=Actor.from_request(request),
        target_type=target_type,
        target_repr=target_repr,
        details={"permission": permission, "method": request.method, "path": request.path},
    )
    raise PermissionDenied(message)
