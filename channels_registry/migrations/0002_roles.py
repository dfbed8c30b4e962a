"""Create the four roles with their permissions."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from dashboard.migrations._frozen_roles import sync_roles_frozen

#: The roles as ``dashboard/roles.py`` listed them at commit dfe3048 (frozen).
ROLE_PERMISSIONS: dict[str, list[str]] = {
    "viewer": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
    ],
    "oncall": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
    ],
    "compliance": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
        "audit.view_auditevent",
        "audit.export_auditevent",
        "audit.verify_auditevent",
        "channels_registry.reveal_channel_payload",
    ],
    "registry_admin": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
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
        ("channels_registry", "0001_initial"),
        ("audit", "0002_append_only"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(sync_roles, migrations.RunPython.noop)]
