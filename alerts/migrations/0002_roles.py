"""Give viewers the alert pages, on-call acknowledge and silence, registry admins the
destinations and rule overrides (see dashboard/roles.py)."""

from __future__ import annotations

from django.db import migrations

from dashboard.roles import sync_roles


class Migration(migrations.Migration):
    dependencies = [("alerts", "0001_initial")]
    operations = [migrations.RunPython(sync_roles, migrations.RunPython.noop)]
