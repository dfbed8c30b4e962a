"""Give the roles the dead-letter permissions (see dashboard/roles.py)."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from dashboard.migrations._frozen_roles import sync_roles_frozen

#: The roles as ``dashboard/roles.py`` listed them at commit 6f9a1e0 (frozen).
ROLE_PERMISSIONS: dict[str, list[str]] = {
    "viewer": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
        "dlq.view_deadletter",
        "dlq.view_failuregroup",
    ],
    "oncall": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
        "dlq.view_deadletter",
        "dlq.view_failuregroup",
    ],
    "compliance": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
        "dlq.view_deadletter",
        "dlq.view_failuregroup",
        "audit.view_auditevent",
        "audit.export_auditevent",
        "audit.verify_auditevent",
        "channels_registry.reveal_channel_payload",
    ],
    "registry_admin": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
        "dlq.view_deadletter",
        "dlq.view_failuregroup",
        "channels_registry.add_broker",
        "channels_registry.change_broker",
        "channels_registry.delete_broker",
        "channels_registry.add_channel",
        "channels_registry.change_channel",
        "channels_registry.delete_channel",
    ],
}


def sync_roles(apps: Any, schema_editor: Any) -> None:
    sync_roles_frozen(apps, ROLE_PERMISSIONS)


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0002_search_trgm"),
        ("channels_registry", "0002_roles"),
    ]
    operations = [migrations.RunPython(sync_roles, migrations.RunPython.noop)]
