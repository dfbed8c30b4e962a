"""Give on-call the replay, discard and approval permissions (see dashboard/roles.py)."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from dashboard.migrations._frozen_roles import sync_roles_frozen

#: The roles as ``dashboard/roles.py`` listed them at commit ab60b93 (frozen).
ROLE_PERMISSIONS: dict[str, list[str]] = {
    "viewer": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
        "dlq.view_deadletter",
        "dlq.view_failuregroup",
        "dlq.view_replayplan",
        "alerts.view_alert",
        "alerts.view_silence",
    ],
    "oncall": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
        "dlq.view_deadletter",
        "dlq.view_failuregroup",
        "dlq.view_replayplan",
        "alerts.view_alert",
        "alerts.view_silence",
        "dlq.replay_deadletter",
        "dlq.discard_deadletter",
        "dlq.approve_bulk_action",
        "alerts.ack_alert",
        "alerts.add_silence",
        "alerts.change_silence",
    ],
    "compliance": [
        "channels_registry.view_broker",
        "channels_registry.view_channel",
        "dlq.view_deadletter",
        "dlq.view_failuregroup",
        "dlq.view_replayplan",
        "alerts.view_alert",
        "alerts.view_silence",
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
        "dlq.view_replayplan",
        "alerts.view_alert",
        "alerts.view_silence",
        "channels_registry.add_broker",
        "channels_registry.change_broker",
        "channels_registry.delete_broker",
        "channels_registry.add_channel",
        "channels_registry.change_channel",
        "channels_registry.delete_channel",
        "alerts.view_destination",
        "alerts.add_destination",
        "alerts.change_destination",
        "alerts.delete_destination",
        "alerts.view_ruleoverride",
        "alerts.add_ruleoverride",
        "alerts.change_ruleoverride",
        "alerts.delete_ruleoverride",
    ],
}


def sync_roles(apps: Any, schema_editor: Any) -> None:
    sync_roles_frozen(apps, ROLE_PERMISSIONS)


class Migration(migrations.Migration):
    dependencies = [("dlq", "0004_replay_plans")]
    operations = [migrations.RunPython(sync_roles, migrations.RunPython.noop)]
