"""Create the four roles with their permissions."""

from __future__ import annotations

from django.db import migrations

from dashboard.roles import sync_roles


class Migration(migrations.Migration):
    dependencies = [
        ("channels_registry", "0001_initial"),
        ("audit", "0002_append_only"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(sync_roles, migrations.RunPython.noop)]
