"""The four roles (Django groups) and their permissions, as DESIGN.md lists them.

Each role includes the one above it. Apps that add permissions append them here and ship a data
migration with a frozen copy of this mapping handed to
``dashboard.migrations._frozen_roles.sync_roles_frozen`` (never an import of this module, so the
migration keeps doing what it did); permissions that do not exist yet are skipped.
"""

from __future__ import annotations

from typing import Any

VIEWER = "viewer"
ONCALL = "oncall"
COMPLIANCE = "compliance"
REGISTRY_ADMIN = "registry_admin"
#: A script (``audit/witness.py``) run by compliance elsewhere: checkpoints, proofs, cosigning.
AUDIT_WITNESS = "audit_witness"

_VIEW = [
    "channels_registry.view_broker",
    "channels_registry.view_channel",
    "dlq.view_deadletter",
    "dlq.view_failuregroup",
    "dlq.view_replayplan",
    "alerts.view_alert",
    "alerts.view_silence",
]
ROLE_PERMISSIONS: dict[str, list[str]] = {
    VIEWER: _VIEW,
    ONCALL: [
        *_VIEW,
        "dlq.replay_deadletter",
        "dlq.discard_deadletter",
        "dlq.approve_bulk_action",
        "alerts.ack_alert",
        "alerts.add_silence",
        "alerts.change_silence",
    ],
    COMPLIANCE: [
        *_VIEW,
        "audit.view_auditevent",
        "audit.export_auditevent",
        "audit.verify_auditevent",
        "channels_registry.reveal_channel_payload",
    ],
    AUDIT_WITNESS: ["audit.witness_auditevent"],
    REGISTRY_ADMIN: [
        *_VIEW,
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


def sync_roles(apps: Any, schema_editor: Any = None) -> None:
    """Create the groups and give each exactly its permissions (usable from migrations)."""
    from django.apps import apps as global_apps
    from django.contrib.auth.management import create_permissions

    if apps is not global_apps:
        # In a migration, permissions of apps migrated in the same run do not exist yet.
        for app_config in apps.get_app_configs():
            app_config.models_module = True
            create_permissions(app_config, apps=apps, verbosity=0)
            app_config.models_module = None
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    for role, perms in ROLE_PERMISSIONS.items():
        group, _ = group_model.objects.get_or_create(name=role)
        wanted = []
        for dotted in perms:
            app_label, codename = dotted.split(".", 1)
            found = permission_model.objects.filter(
                content_type__app_label=app_label, codename=codename
            ).first()
            if found is not None:
                wanted.append(found)
        group.permissions.set(wanted)
