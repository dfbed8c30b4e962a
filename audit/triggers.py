"""Database triggers that make the audit table append-only.

PostgreSQL refuses UPDATE, DELETE and TRUNCATE; SQLite refuses UPDATE and DELETE (it has no
TRUNCATE). The one update allowed is the sealer's: an unsealed row (``seq`` null) gets its
``seq``, ``prev_hash`` and ``hash`` once, every other column unchanged. Used by the migrations
and, to tamper on purpose, by the tests.
"""

from __future__ import annotations

from typing import Any

TABLE = "audit_auditevent"

# Every column but the three the sealer sets, and the primary key (named on its own). Migration
# 0004's list is frozen (its triggers must not name the ``mac`` column added later).
_KEPT_0004 = [
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
_KEPT = [*_KEPT_0004, "mac"]


def _postgres_install(kept: list[str], insert_check: bool) -> list[str]:
    new = ", ".join(f"NEW.{c}" for c in ["id", *kept])
    old = ", ".join(f"OLD.{c}" for c in ["id", *kept])
    statements = [
        f"""
    CREATE OR REPLACE FUNCTION dlo_audit_append_only() RETURNS trigger AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
           AND NEW.hash IS NOT NULL
           AND ({new}) IS NOT DISTINCT FROM ({old}) THEN
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
    if insert_check:
        # Rows enter unsealed, with a MAC of the right shape: only the sealer numbers them
        # (after checking the MAC). A superuser can drop this; the sealer and the verifier
        # check the MAC itself, this only stops the careless and the merely privileged.
        statements += [
            """
    CREATE OR REPLACE FUNCTION dlo_audit_insert_check() RETURNS trigger AS $$
    BEGIN
        IF NEW.seq IS NOT NULL OR NEW.hash IS NOT NULL OR NEW.prev_hash <> '' THEN
            RAISE EXCEPTION 'audit events are inserted unsealed (the sealer numbers them)'
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF NEW.mac !~ '^[0-9a-f]{96}$' THEN
            RAISE EXCEPTION 'audit events carry the application''s MAC'
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;
    END;
    $$ LANGUAGE plpgsql;
    """,
            f"DROP TRIGGER IF EXISTS dlo_audit_insert_check ON {TABLE}",
            f"""CREATE TRIGGER dlo_audit_insert_check BEFORE INSERT ON {TABLE}
        FOR EACH ROW EXECUTE FUNCTION dlo_audit_insert_check()""",
        ]
    return statements


_POSTGRES_INSTALL = _postgres_install(_KEPT, insert_check=True)
_POSTGRES_INSTALL_0004 = _postgres_install(_KEPT_0004, insert_check=False)
_POSTGRES_DROP = [
    f"DROP TRIGGER IF EXISTS dlo_audit_no_update_delete ON {TABLE}",
    f"DROP TRIGGER IF EXISTS dlo_audit_no_truncate ON {TABLE}",
    f"DROP TRIGGER IF EXISTS dlo_audit_insert_check ON {TABLE}",
]


def _sqlite_install(kept: list[str], insert_check: bool) -> list[str]:
    changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in ["id", *kept])
    statements = [
        "DROP TRIGGER IF EXISTS dlo_audit_no_update",
        f"""CREATE TRIGGER dlo_audit_no_update BEFORE UPDATE ON {TABLE}
        WHEN OLD.seq IS NOT NULL OR NEW.seq IS NULL OR NEW.hash IS NULL OR {changed}
        BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END""",
        f"""CREATE TRIGGER IF NOT EXISTS dlo_audit_no_delete BEFORE DELETE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'audit events are append-only (DELETE refused)'); END""",
    ]
    if insert_check:
        statements += [
            "DROP TRIGGER IF EXISTS dlo_audit_insert_check",
            f"""CREATE TRIGGER dlo_audit_insert_check BEFORE INSERT ON {TABLE}
        WHEN NEW.seq IS NOT NULL OR NEW.hash IS NOT NULL OR NEW.prev_hash <> ''
            OR length(NEW.mac) <> 96
        BEGIN SELECT RAISE(ABORT, 'audit events are inserted unsealed, with a MAC'); END""",
        ]
    return statements


_SQLITE_INSTALL = _sqlite_install(_KEPT, insert_check=True)
_SQLITE_INSTALL_0004 = _sqlite_install(_KEPT_0004, insert_check=False)
_SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS dlo_audit_no_update",
    "DROP TRIGGER IF EXISTS dlo_audit_no_delete",
    "DROP TRIGGER IF EXISTS dlo_audit_insert_check",
]


def _statements(vendor: str, install: bool, *, at_0004: bool = False) -> list[str]:
    if vendor == "postgresql":
        if install:
            return _POSTGRES_INSTALL_0004 if at_0004 else _POSTGRES_INSTALL
        return _POSTGRES_DROP
    if vendor == "sqlite":
        if install:
            return _SQLITE_INSTALL_0004 if at_0004 else _SQLITE_INSTALL
        return _SQLITE_DROP
    raise RuntimeError(f"append-only triggers are not written for {vendor!r} databases")


# Migration 0002's triggers, frozen (SQLite checks trigger columns when a later migration
# rebuilds the table, and the columns the current ones name do not exist yet at 0002).
_LEGACY_SQLITE_INSTALL = [
    f"""CREATE TRIGGER IF NOT EXISTS dlo_audit_no_update BEFORE UPDATE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END""",
    _SQLITE_INSTALL_0004[-1],
]


def install_legacy(connection: Any) -> None:
    vendor = connection.vendor
    statements = (
        _LEGACY_SQLITE_INSTALL if vendor == "sqlite" else _statements(vendor, True, at_0004=True)
    )
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)


def install(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, install=True):
            cursor.execute(sql)


def install_0004(connection: Any) -> None:
    """The triggers as migration 0004 installed them (before the ``mac`` column existed)."""
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, install=True, at_0004=True):
            cursor.execute(sql)


def drop(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, install=False):
            cursor.execute(sql)
