"""An entry's status moves off the dead-letter row into ``dlq_entrystate`` (issue 24).

The dead-letter row is written once by ingest; a freeze, a replay or a discard updates the
narrow state row instead (``dlq.models.entries.EntryState``). Steps, each in its own short
transaction (the migration is not atomic), so no lock is held for the copy:

1. the state table, with its indexes (empty: instant);
2. PostgreSQL: a statement trigger that makes the state rows of every insert into
   ``dlq_deadletter``, whoever inserts, and a row trigger that copies the columns the state
   row carries when an update names one of them (ingest never does); then the existing entries' rows, copied in chunks of
   ``CHUNK`` ids (``ON CONFLICT DO NOTHING``: rows the trigger already made stay);
3. the status column and its three indexes dropped from ``dlq_deadletter`` (catalog only on
   PostgreSQL: a moment's exclusive lock per statement);
4. SQLite: the same two as row triggers (after step 3, because SQLite rebuilds the table to drop a column
   and a rebuild loses the table's triggers).

Measured on 1,000,000 entries in ``docs/performance.md``. Stop the workers (relay, ingest) for
the upgrade as for every migration: a status the old code writes to the old column after the
copy would be lost. Reversible: backwards puts the column back, filled from the state rows.
"""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.db import migrations, models, transaction

TABLE = "dlq_deadletter"
STATE = "dlq_entrystate"
CHUNK = 50_000
COLUMNS = "entry_id, status, channel_id, source, group_id, ingested_at, dead_lettered_at"
FROM_ENTRY = "id, {status}, channel_id, source, group_id, ingested_at, dead_lettered_at"
#: The entry's columns the state row copies. Ingest never changes them; whatever else does
#: (a test backdating an entry, a deleted group's SET NULL) has them copied by a row trigger
#: that only an UPDATE naming one of them fires.
COPIED = "channel_id, source, group_id, ingested_at, dead_lettered_at"
SYNC = ", ".join(f"{c} = NEW.{c}" for c in COPIED.split(", "))

PG_TRIGGER = f"""
CREATE FUNCTION dlq_entry_state_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {STATE} ({COLUMNS})
  SELECT {FROM_ENTRY.format(status="'new'")} FROM fresh
  ON CONFLICT (entry_id) DO NOTHING;
  RETURN NULL;
END $$;
CREATE TRIGGER dlq_entry_state_insert AFTER INSERT ON {TABLE}
  REFERENCING NEW TABLE AS fresh FOR EACH STATEMENT
  EXECUTE FUNCTION dlq_entry_state_insert();
CREATE FUNCTION dlq_entry_state_copy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE {STATE} SET {SYNC} WHERE entry_id = NEW.id;
  RETURN NULL;
END $$;
CREATE TRIGGER dlq_entry_state_copy AFTER UPDATE OF {COPIED} ON {TABLE} FOR EACH ROW
  EXECUTE FUNCTION dlq_entry_state_copy();
"""

SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER dlq_entry_state_insert AFTER INSERT ON {TABLE} FOR EACH ROW BEGIN
  INSERT OR IGNORE INTO {STATE} ({COLUMNS}) VALUES (NEW.id, 'new', NEW.channel_id, NEW.source,
    NEW.group_id, NEW.ingested_at, NEW.dead_lettered_at);
END""",
    f"""CREATE TRIGGER dlq_entry_state_copy AFTER UPDATE OF {COPIED} ON {TABLE} FOR EACH ROW
BEGIN
  UPDATE {STATE} SET {SYNC} WHERE entry_id = NEW.id;
END""",
]


def _copy(cursor: Any, status: str) -> None:
    cursor.execute(f"SELECT min(id), max(id) FROM {TABLE}")
    low, high = cursor.fetchone()
    if low is None:
        return
    for start in range(low, high + 1, CHUNK):
        with transaction.atomic():
            cursor.execute(
                f"INSERT INTO {STATE} ({COLUMNS}) SELECT {FROM_ENTRY.format(status=status)} "
                f"FROM {TABLE} WHERE id >= %s AND id < %s ON CONFLICT (entry_id) DO NOTHING",
                [start, start + CHUNK],
            )


def forwards(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        if schema_editor.connection.vendor == "postgresql":
            cursor.execute(PG_TRIGGER)
        _copy(cursor, "status")
        if schema_editor.connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {STATE}")


def backwards(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        if schema_editor.connection.vendor == "postgresql":
            cursor.execute(f"DROP TRIGGER IF EXISTS dlq_entry_state_insert ON {TABLE}")
            cursor.execute(f"DROP TRIGGER IF EXISTS dlq_entry_state_copy ON {TABLE}")
            cursor.execute("DROP FUNCTION IF EXISTS dlq_entry_state_insert()")
            cursor.execute("DROP FUNCTION IF EXISTS dlq_entry_state_copy()")
        cursor.execute(
            f"UPDATE {TABLE} SET status = s.status FROM {STATE} s WHERE s.entry_id = {TABLE}.id"
        )


def sqlite_trigger(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "sqlite":
        with schema_editor.connection.cursor() as cursor:
            for sql in SQLITE_TRIGGERS:
                cursor.execute(sql)


def drop_sqlite_trigger(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "sqlite":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS dlq_entry_state_insert")
            cursor.execute("DROP TRIGGER IF EXISTS dlq_entry_state_copy")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("channels_registry", "0015_activemq_broker_kind"),
        ("dlq", "0014_replay_outcome_records"),
    ]

    operations = [
        migrations.CreateModel(
            name="EntryState",
            fields=[
                (
                    "entry",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="state",
                        serialize=False,
                        to="dlq.deadletter",
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("new", "New"),
                            ("replaying", "Replaying"),
                            ("replayed", "Replayed"),
                            ("failed", "Replay failed"),
                            ("discarded", "Discarded"),
                        ],
                        default="new",
                        max_length=12,
                    ),
                ),
                (
                    "source",
                    models.CharField(
                        choices=[("dlq", "DLQ"), ("poison", "Poison")],
                        default="dlq",
                        max_length=8,
                    ),
                ),
                ("ingested_at", models.DateTimeField()),
                ("dead_lettered_at", models.DateTimeField()),
                (
                    "channel",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="channels_registry.channel",
                    ),
                ),
                (
                    "group",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="dlq.failuregroup",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["status", "entry"], name="dlq_state_status_entry"),
                    models.Index(
                        condition=models.Q(
                            ("status__in", ("replayed", "discarded")), _negated=True
                        ),
                        fields=["group"],
                        name="dlq_state_open_group",
                    ),
                    models.Index(
                        condition=models.Q(
                            ("status__in", ("replayed", "discarded")), _negated=True
                        ),
                        fields=["channel", "source"],
                        name="dlq_state_open_channel",
                    ),
                ],
            },
        ),
        migrations.RunPython(forwards, backwards, elidable=False),
        migrations.RemoveIndex(model_name="deadletter", name="dlq_entry_status_id"),
        migrations.RemoveIndex(model_name="deadletter", name="dlq_entry_open_group"),
        migrations.RemoveIndex(model_name="deadletter", name="dlq_entry_open_channel"),
        migrations.RemoveField(model_name="deadletter", name="status"),
        migrations.RunPython(sqlite_trigger, drop_sqlite_trigger, elidable=False),
    ]
