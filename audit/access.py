"""The one access helper of the audit trail, used by every audit view and the API.

A refusal is itself audited (``outcome=denied``) before the 403: who tried to read, export or
verify the trail without the permission is exactly what a compliance review looks for.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest

from audit.actions import Actor, do_record_denial
from audit.models import AuditEvent

VIEW = "audit.view_auditevent"
EXPORT = "audit.export_auditevent"
VERIFY = "audit.verify_auditevent"

# The audited action named for each permission when it is refused.
_DENIED_ACTION = {VIEW: "audit.view", EXPORT: "audit.export", VERIFY: "audit.verify"}


def require_audit_permission(request: HttpRequest, permission: str) -> None:
    """Return if the user has ``permission``; otherwise record the denial and raise 403."""
    if request.user.has_perm(permission):
        return
    do_record_denial(
        _DENIED_ACTION[permission],
        actor=Actor.from_request(request),
        target_type="audit.trail",
        target_repr="audit trail",
        details={"permission": permission, "method": request.method, "path": request.path},
    )
    raise PermissionDenied("You need the compliance role to use the audit trail.")


def events_for_user(request: HttpRequest, permission: str = VIEW) -> QuerySet[AuditEvent]:
    require_audit_permission(request, permission)
    return AuditEvent.objects.all()


WITNESS = "audit.witness_auditevent"
_DENIED_ACTION[WITNESS] = "audit.witness"


def require_witness_access(request: HttpRequest) -> None:
    """Checkpoints and proofs: the compliance role, or an audit-witness token."""
    if request.user.has_perm(VIEW):
        return
    require_audit_permission(request, WITNESS)
