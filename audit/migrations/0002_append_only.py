"""Make audit events append-only in the database and create the chain's head row."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from audit import triggers


def forwards(apps: Any, schema_editor: Any) -> None:
    triggers.install_legacy(schema_editor.connection)
    apps.get_model("audit", "AuditHead").objects.get_or_create(pk=1, defaults={"seq": 0})


def backwards(apps: Any, schema_editor: Any) -> None:
    triggers.drop(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
