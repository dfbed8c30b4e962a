"""Give on-call the replay, discard and approval permissions (see dashboard/roles.py)."""

from __future__ import annotations

from django.db import migrations

from dashboard.roles import sync_roles


class Migration(migrations.Migration):
    dependencies = [("dlq", "0004_replay_plans")]
    operations = [migrations.RunPython(sync_roles, migrations.RunPython.noop)]
