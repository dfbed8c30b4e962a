"""Database triggers that make the audit table append-only.

PostgreSQL refuses UPDATE, DELETE and TRUNCATE; SQLite refuses UPDATE and DELETE (it has no
TRUNCATE). The one update allowed is the sealer's: an unsealed row (``seq`` null) gets its
``seq``, ``prev_hash`` and ``hash`` once, every other column unchanged. Used by the migrations
and, to tamper on purpose, by the tests.
"""

from __future__ import annotations

from typing import Any

TABLE = "audit_auditevent"

# Every column but the three the sealer sets, and the primary key (named on its own).
_KEPT = [
    "created_at",
    "actor_id",
    "actor_username",
    "source_ip",
    "action",
    "target_type",
    "target_id",
    "target_repr",
    "channel_slug",
    "reason",
    "before",
    "after",
    "changes",
    "outcome",
    "plan_id",
    "hash_version",
    "index_json",
    "detail_json",
]
_NEW = ", ".join(f"NEW.{c}" for c in ["id", *_KEPT])
_OLD = ", ".join(f"OLD.{c}" for c in ["id", *_KEPT])
_POSTGRES_INSTALL = [
    f"""
    CREATE OR REPLACE FUNCTION dlo_audit_append_only() RETURNS trigger AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
           AND NEW.hash IS NOT NULL
           AND ({_NEW}) IS NOT DISTINCT FROM ({_OLD}) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'audit events are append-only (% refused)', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END;
    $$ LANGUAGE plpgsql;
    """,
    f"DROP TRIGGER IF EXISTS dlo_audit_no_update_delete ON {TABLE}",
    f"""CREATE TRIGGER dlo_audit_no_update_delete BEFORE UPDATE OR DELETE ON {TABLE}
        FOR EACH ROW EXECUTE FUNCTION dlo_audit_append_only()""",
    f"DROP TRIGGER IF EXISTS dlo_audit_no_truncate ON {TABLE}",
    f"""CREATE TRIGGER dlo_audit_no_truncate BEFORE TRUNCATE ON {TABLE}
        FOR EACH STATEMENT EXECUTE FUNCTION dlo_audit_append_only()""",
]
_POSTGRES_DROP = [
    f"DROP TRIGGER IF EXISTS dlo_audit_no_update_delete ON {TABLE}",
    f"DROP TRIGGER IF EXISTS dlo_audit_no_truncate ON {TABLE}",
]
_SQLITE_CHANGED = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in ["id", *_KEPT])
_SQLITE_INSTALL = [
    "DROP TRIGGER IF EXISTS dlo_audit_no_update",
    f"""CREATE TRIGGER dlo_audit_no_update BEFORE UPDATE ON {TABLE}
        WHEN OLD.seq IS NOT NULL OR NEW.seq IS NULL OR NEW.hash IS NULL OR {_SQLITE_CHANGED}
        BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END""",
    f"""CREATE TRIGGER IF NOT EXISTS dlo_audit_no_delete BEFORE DELETE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'audit events are append-only (DELETE refused)'); END""",
]
_SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS dlo_audit_no_update",
    "DROP TRIGGER IF EXISTS dlo_audit_no_delete",
]


def _statements(vendor: str, install: bool) -> list[str]:
    if vendor == "postgresql":
        return _POSTGRES_INSTALL if install else _POSTGRES_DROP
    if vendor == "sqlite":
        return _SQLITE_INSTALL if install else _SQLITE_DROP
    raise RuntimeError(f"append-only triggers are not written for {vendor!r} databases")


# Migration 0002's triggers, frozen (SQLite checks trigger columns when a later migration
# rebuilds the table, and the columns the current ones name do not exist yet at 0002).
_LEGACY_SQLITE_INSTALL = [
    f"""CREATE TRIGGER IF NOT EXISTS dlo_audit_no_update BEFORE UPDATE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END""",
    _SQLITE_INSTALL[-1],
]


def install_legacy(connection: Any) -> None:
    vendor = connection.vendor
    statements = _LEGACY_SQLITE_INSTALL if vendor == "sqlite" else _statements(vendor, True)
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)


def install(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, install=True):
            cursor.execute(sql)


def drop(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, install=False):
            cursor.execute(sql)
