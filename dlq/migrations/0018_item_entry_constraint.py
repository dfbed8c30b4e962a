"""The replay items' foreign key to the dead letters goes (the column and its index stay).

Its check ran at the freeze's commit, once per item: ``SELECT … FOR KEY SHARE`` on the
entry's wide row, which marks the row locked and so dirties (and, after a checkpoint, logs in
full) every page of the dead-letter table a plan covers. A 1M-entry freeze spent about half
its time there. The product keeps the link valid itself, as it does for the state and search
rows: the freeze inserts an item only for an entry whose state row it holds locked, entries
leave only by whole partitions, which delete their items first, and an ORM delete cascades.

On PostgreSQL only the parent constraint is dropped (Django's ``AlterField`` tries each
partition's inherited copy too, which PostgreSQL refuses). Dropping it takes an exclusive
lock on the dead-letter table for a moment; each attempt waits at most ``LOCK_TIMEOUT``, so
pages queue behind it no longer than that, and a busy store is retried. The way back adds the
constraint ``NOT VALID`` and then, in a transaction of its own, validates it, which checks the
items without blocking their writers."""

import time

import django.db.models.deletion
from django.db import OperationalError, migrations, models, transaction

LOCK_TIMEOUT = "500ms"
ATTEMPTS = 20
ITEMS, ENTRIES = "dlq_replayitem", "dlq_deadletter"
NAME = "dlq_replayitem_entry_id_68ac7a9e_fk_dlq_deadletter_id"  # Django's name for it


def _constraints(cursor):
    """The items' own (not inherited) foreign keys to the dead letters."""
    cursor.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass "
        "AND confrelid = %s::regclass AND contype = 'f' AND conparentid = 0",
        [ITEMS, ENTRIES],
    )
    return [row[0] for row in cursor.fetchall()]


def _with_lock_timeout(schema_editor, sql):
    """``sql`` under a short lock timeout, retried with back-off (a transaction per attempt:
    the migration is not atomic)."""
    for attempt in range(ATTEMPTS):
        try:
            connection = schema_editor.connection
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                cursor.execute(sql)
            return
        except OperationalError:
            if attempt == ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


class DropEntryConstraint(migrations.AlterField):
    """``AlterField`` whose PostgreSQL side drops only the parent constraint."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        with schema_editor.connection.cursor() as cursor:
            names = _constraints(cursor)
        for name in names:
            _with_lock_timeout(schema_editor, f'ALTER TABLE {ITEMS} DROP CONSTRAINT "{name}"')

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        with schema_editor.connection.cursor() as cursor:
            names = _constraints(cursor)
        if not names:
            _with_lock_timeout(
                schema_editor,
                f'ALTER TABLE {ITEMS} ADD CONSTRAINT "{NAME}" FOREIGN KEY (entry_id) '
                f"REFERENCES {ENTRIES} (id) DEFERRABLE INITIALLY DEFERRED NOT VALID",
            )
        # Its own transaction: the check reads every item without blocking their writers.
        for name in names or [NAME]:
            schema_editor.execute(f'ALTER TABLE {ITEMS} VALIDATE CONSTRAINT "{name}"')


class Migration(migrations.Migration):
    # Each step commits on its own: the lock of an attempt is held only for that attempt, and
    # the way back validates outside the transaction that added the constraint.
    atomic = False

    dependencies = [
        ("dlq", "0017_item_plan_index"),
    ]

    operations = [
        DropEntryConstraint(
            model_name="replayitem",
            name="entry",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="items",
                to="dlq.deadletter",
            ),
        ),
    ]
