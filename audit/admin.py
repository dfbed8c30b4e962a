"""A read-only view of the trail in the admin for superusers; compliance uses /audit/."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEvent
from dashboard.admin_text import VisibleTextAdmin


@admin.register(AuditEvent)
class AuditEventAdmin(VisibleTextAdmin):
    list_display = ["seq", "created_at", "actor_username", "action", "target_repr", "outcome"]
    list_filter = ["action", "outcome"]
    search_fields = ["actor_username", "target_repr", "reason"]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
