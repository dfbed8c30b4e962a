"""The plan page's problems (its items with an error, in plan order) get a partial index on
``(plan, position)``: without one, the page read every item of the plan to find them (61-66 ms
for a plan of 1M). Only items with an error have an entry; a confirmed outcome clears the
error, so the relay's usual write adds none.

On PostgreSQL the index is built ``CONCURRENTLY``: reads and writes go on meanwhile, so the
migration runs outside a transaction."""

from django.db import migrations, models

INDEX = "dlq_item_plan_error_pos"


def _concurrently(schema_editor):
    return "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # An interrupted concurrent build leaves an invalid index that IF NOT EXISTS would keep.
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(%s) AND NOT indisvalid",
                [INDEX],
            )
            if cursor.fetchone():
                drop_index(apps, schema_editor)
    schema_editor.execute(
        f'CREATE INDEX {_concurrently(schema_editor)}IF NOT EXISTS "{INDEX}" '
        'ON "dlq_replayitem" ("plan_id", "position") WHERE NOT ("last_error" = \'\')'
    )


def drop_index(apps, schema_editor):
    schema_editor.execute(f'DROP INDEX {_concurrently(schema_editor)}IF EXISTS "{INDEX}"')


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("dlq", "0018_item_entry_constraint"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="replayitem",
                    index=models.Index(
                        condition=models.Q(("last_error", ""), _negated=True),
                        fields=["plan", "position"],
                        name=INDEX,
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(create_index, drop_index)],
        ),
    ]
