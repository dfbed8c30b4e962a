"""Give the roles the dead-letter permissions (see dashboard/roles.py)."""

from __future__ import annotations

from django.db import migrations

from dashboard.roles import sync_roles


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0002_search_trgm"),
        ("channels_registry", "0002_roles"),
    ]
    operations = [migrations.RunPython(sync_roles, migrations.RunPython.noop)]
