from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from dlq.models import DeadLetter, FailureGroup


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    """Read-only, for set-up and as the triage benchmark's baseline; triage is /dead-letters/."""

    list_display = ["id", "channel", "source", "status", "reason", "dead_lettered_at"]
    list_filter = ["source", "status", "channel"]
    search_fields = ["search_text"]
    exclude = ["body"]


@admin.register(FailureGroup)
class FailureGroupAdmin(ReadOnlyAdmin):
    list_display = ["id", "channel", "reason", "error_class", "count", "last_seen"]
