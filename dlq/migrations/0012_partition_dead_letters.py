"""PostgreSQL: ``dlq_deadletter`` becomes ``PARTITION BY RANGE (id)`` (see ``dlq.capture.partitions``).

On SQLite only the (unused) ``dlq_deadletter_key`` table is created; the dead-letter table
stays as it is. On PostgreSQL the table is rebuilt: renamed aside, a partitioned copy created
with the same columns, checks, indexes (same names) and foreign keys (same names, both to and
from it), the rows copied over, the old table dropped. Differences from the plain table:

* the id comes from the sequence ``dlq_deadletter_id_seq`` (owned by the column; PostgreSQL 15
  has no identity columns on partitioned tables), continuing where the identity left off;
* ``UNIQUE (dedupe_key)`` is replaced by ``dlq_deadletter_key`` and a trigger: the model keeps
  ``unique=True`` (the SQLite table keeps the constraint), so a future ``AlterField`` of
  ``dedupe_key`` must be written as SQL for PostgreSQL;
* ``CREATE INDEX CONCURRENTLY`` does not work on the partitioned table: future indexes are
  created per partition (``ON ONLY`` + ``ATTACH``) or plainly in a quiet moment.

The copy is O(table): on a large existing installation run this migration in a maintenance
window (ingest stopped). It is reversible: backwards rebuilds the plain table the same way.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import migrations, models

TABLE = "dlq_deadletter"
OLD = "dlq_deadletter_unpartitioned"
SEQUENCE = "dlq_deadletter_id_seq"
KEYS = "dlq_deadletter_key"
UNIQUE = "dlq_deadletter_dedupe_key_key"

TRIGGER_SQL = f"""
CREATE FUNCTION dlq_deadletter_key_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO {KEYS} (dedupe_key) VALUES (NEW.dedupe_key);
    RETURN NEW;
  ELSIF TG_OP = 'UPDATE' THEN
    UPDATE {KEYS} SET dedupe_key = NEW.dedupe_key WHERE dedupe_key = OLD.dedupe_key;
    RETURN NEW;
  END IF;
  DELETE FROM {KEYS} WHERE dedupe_key = OLD.dedupe_key;
  RETURN OLD;
END $$;
-- Ingest writes the keys of a whole batch itself, in the same statement, and says so.
CREATE TRIGGER dlq_deadletter_key_insert BEFORE INSERT ON {TABLE} FOR EACH ROW
  WHEN (current_setting('dlo.dedupe_keys_written', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION dlq_deadletter_key_sync();
CREATE TRIGGER dlq_deadletter_key_update AFTER UPDATE OF dedupe_key ON {TABLE} FOR EACH ROW
  WHEN (OLD.dedupe_key IS DISTINCT FROM NEW.dedupe_key)
  EXECUTE FUNCTION dlq_deadletter_key_sync();
CREATE TRIGGER dlq_deadletter_key_delete AFTER DELETE ON {TABLE} FOR EACH ROW
  EXECUTE FUNCTION dlq_deadletter_key_sync();
"""


def _dependants(cursor: Any) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Foreign keys to and from the table (name, table, definition) and its secondary index
    definitions (not the primary key, not the dedupe unique), read before any rename."""
    cursor.execute(
        "SELECT conname, conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE contype = 'f' AND (confrelid = %s::regclass OR conrelid = %s::regclass) "
        "AND conparentid = 0",
        [TABLE, TABLE],
    )
    fks = cursor.fetchall()
    cursor.execute(
        "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i "
        "LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid "
        "WHERE i.indrelid = %s::regclass AND c.oid IS NULL",
        [TABLE],
    )
    indexes = [definition for _, definition in cursor.fetchall()]
    return fks, indexes


def _set_aside(cursor: Any, fks: list[tuple[str, str, str]], indexes: list[str]) -> int:
    """Rename the table aside, free its constraint and index names; returns the highest id."""
    cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    cursor.execute(f"SELECT coalesce(max(id), 0) FROM {TABLE}")
    high = cursor.fetchone()[0]
    cursor.execute(f"SELECT pg_get_serial_sequence('{TABLE}', 'id')")
    (sequence,) = cursor.fetchone()
    if sequence:
        cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
        last, called = cursor.fetchone()
        high = max(high, last if called else last - 1)
    cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {OLD}")
    for name, table, _ in fks:
        cursor.execute(f"ALTER TABLE {OLD if table == TABLE else table} DROP CONSTRAINT {name}")
    for definition in indexes:
        name = definition.split(" INDEX ", 1)[1].split(" ON ", 1)[0]
        cursor.execute(f"DROP INDEX {name}")
    cursor.execute(f"ALTER TABLE {OLD} DROP CONSTRAINT {TABLE}_pkey")
    cursor.execute(f"ALTER TABLE {OLD} DROP CONSTRAINT IF EXISTS {UNIQUE}")
    return int(high)


def _restore(cursor: Any, fks: list[tuple[str, str, str]], indexes: list[str]) -> None:
    """Copy the rows over, drop the old table, recreate indexes and foreign keys."""
    cursor.execute(f"INSERT INTO {TABLE} SELECT * FROM {OLD}")
    copied = cursor.rowcount
    cursor.execute(f"DROP TABLE {OLD}")
    for definition in indexes:
        cursor.execute(definition.replace(" ON ONLY ", " ON ", 1))
    for name, table, definition in fks:
        cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
    if copied > 0:  # fresh statistics for the copied rows (an empty table is left unanalyzed)
        cursor.execute(f"ANALYZE {TABLE}")


def partition(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    size = max(1, int(getattr(settings, "DLO_DLQ_PARTITION_SIZE", 1_000_000)))
    with schema_editor.connection.cursor() as cursor:
        fks, indexes = _dependants(cursor)
        high = _set_aside(cursor, fks, indexes)
        cursor.execute(f"ALTER TABLE {OLD} ALTER id DROP IDENTITY IF EXISTS")
        cursor.execute(
            f"CREATE TABLE {TABLE} (LIKE {OLD} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
            "PARTITION BY RANGE (id)"
        )
        cursor.execute(f"CREATE SEQUENCE {SEQUENCE} OWNED BY {TABLE}.id")
        cursor.execute("SELECT setval(%s, %s, %s)", [SEQUENCE, max(high, 1), high > 0])
        cursor.execute(f"ALTER TABLE {TABLE} ALTER id SET DEFAULT nextval('{SEQUENCE}')")
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id)")
        # Aligned ranges up to two partitions above the highest id (as dlq.partitions keeps it).
        for lower in range(0, (high // size + 3) * size, size):
            cursor.execute(
                f"CREATE TABLE {TABLE}_{lower} PARTITION OF {TABLE} "
                f"FOR VALUES FROM ({lower}) TO ({lower + size})"
            )
        cursor.execute(f"CREATE TABLE {TABLE}_default PARTITION OF {TABLE} DEFAULT")
        _restore(cursor, fks, indexes)
        # The key table: no pattern-ops index (keys are only ever looked up whole).
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexname LIKE %s",
            [KEYS, "%_like"],
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f"DROP INDEX {name}")
        cursor.execute(f"INSERT INTO {KEYS} (dedupe_key) SELECT dedupe_key FROM {TABLE}")
        cursor.execute(TRIGGER_SQL)


def unpartition(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS dlq_deadletter_key_insert ON {TABLE}")
        cursor.execute(f"DROP TRIGGER IF EXISTS dlq_deadletter_key_update ON {TABLE}")
        cursor.execute(f"DROP TRIGGER IF EXISTS dlq_deadletter_key_delete ON {TABLE}")
        cursor.execute("DROP FUNCTION IF EXISTS dlq_deadletter_key_sync()")
        fks, indexes = _dependants(cursor)
        high = _set_aside(cursor, fks, indexes)
        cursor.execute(f"ALTER TABLE {OLD} ALTER id DROP DEFAULT")
        cursor.execute(
            f"CREATE TABLE {TABLE} (LIKE {OLD} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        cursor.execute(f"ALTER TABLE {TABLE} ALTER id ADD GENERATED BY DEFAULT AS IDENTITY")
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence('{TABLE}', 'id'), %s, %s)",
            [max(high, 1), high > 0],
        )
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id)")
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {UNIQUE} UNIQUE (dedupe_key)")
        # The old table's partitions and its sequence go with it (DROP TABLE in _restore).
        _restore(cursor, fks, indexes)


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0011_group_trend_hours"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeadLetterKey",
            fields=[
                (
                    "dedupe_key",
                    models.CharField(max_length=200, primary_key=True, serialize=False),
                ),
            ],
            options={
                "db_table": "dlq_deadletter_key",
            },
        ),
        migrations.RunPython(partition, unpartition, elidable=False),
    ]
