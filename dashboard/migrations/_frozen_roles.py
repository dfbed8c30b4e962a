"""A frozen copy of ``dashboard.roles.sync_roles`` for data migrations. Never edit this file.

Data migrations must keep doing what they did when they were written, so they do not import
live code: each one carries its own copy of the role→permission mapping as it stood then and
hands it to :func:`sync_roles_frozen`, the migration-time half of ``dashboard.roles.sync_roles``
as of commit a839e76. If the way roles are synced ever has to change, add a new module beside
this one (``_frozen_roles_2.py``) for the new migrations; old migrations keep calling this one.
The leading underscore keeps Django's migration loader from reading this as a migration.
"""

from __future__ import annotations

from typing import Any


def sync_roles_frozen(apps: Any, role_permissions: dict[str, list[str]]) -> None:
    """Create the groups and give each exactly its permissions; unknown permissions are skipped."""
    from django.contrib.auth.management import create_permissions

    # In a migration, permissions of apps migrated in the same run do not exist yet.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    for role, perms in role_permissions.items():
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
