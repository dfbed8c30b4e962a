"""The replay items' own index on ``plan_id`` goes: ``(plan, entry)`` and ``(plan, status,
position)`` lead with the plan, and every relay outcome rewrote it with the item.

Only the index is dropped (Django's ``AlterField`` would also drop and re-add the foreign key,
re-checking every item under a lock that stops the relay). On PostgreSQL the drop is
``CONCURRENTLY``: it waits for running transactions without blocking reads or writes meanwhile,
so the migration runs outside a transaction."""

import django.db.models.deletion
from django.db import migrations, models

INDEX = "dlq_replayitem_plan_id_a63fef2b"  # Django's name for the foreign key's index


def _concurrently(schema_editor):
    return "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""


def drop_index(apps, schema_editor):
    schema_editor.execute(f'DROP INDEX {_concurrently(schema_editor)}IF EXISTS "{INDEX}"')


def create_index(apps, schema_editor):
    schema_editor.execute(
        f"CREATE INDEX {_concurrently(schema_editor)}IF NOT EXISTS "
        f'"{INDEX}" ON "dlq_replayitem" ("plan_id")'
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("dlq", "0016_relay_cursor"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="replayitem",
                    name="plan",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="items",
                        to="dlq.replayplan",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(drop_index, create_index)],
        ),
    ]
