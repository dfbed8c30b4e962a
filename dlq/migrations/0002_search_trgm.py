"""A trigram GIN index for the list's text filter, on PostgreSQL only (SQLite scans)."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(
        "CREATE INDEX IF NOT EXISTS dlq_entry_search_trgm ON dlq_deadletter "
        "USING gin (search_text gin_trgm_ops)"
    )


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS dlq_entry_search_trgm")


class Migration(migrations.Migration):
    dependencies = [("dlq", "0001_initial")]
    operations = [migrations.RunPython(create, drop)]
