"""The one access helper per object type, used by every dead-letter view and the API."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import get_object_or_404

from dlq.models import DeadLetter, FailureGroup
from dlq.redaction import REVEAL_PERMISSION

VIEW_PERMISSION = "dlq.view_deadletter"


def entries_for_user(request: HttpRequest) -> QuerySet[DeadLetter]:
    if not request.user.has_perm(VIEW_PERMISSION):
        raise PermissionDenied("You need the viewer role to see dead letters.")
    return DeadLetter.objects.all()


def get_entry_for_user(request: HttpRequest, pk: int) -> DeadLetter:
    return get_object_or_404(
        entries_for_user(request).select_related("channel", "channel__broker", "group"), pk=pk
    )


def groups_for_user(request: HttpRequest) -> QuerySet[FailureGroup]:
    if not request.user.has_perm("dlq.view_failuregroup"):
        raise PermissionDenied("You need the viewer role to see failure groups.")
    return FailureGroup.objects.select_related("channel", "sample")


def can_reveal(user: Any) -> bool:
    return bool(user.has_perm(REVEAL_PERMISSION))
