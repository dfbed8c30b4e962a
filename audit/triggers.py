"""Database triggers that make the audit table append-only.

PostgreSQL refuses UPDATE, DELETE and TRUNCATE; SQLite refuses UPDATE and DELETE (it has no
TRUNCATE). Used by the migration and, to tamper on purpose, by the tests.
"""

from __future__ import annotations

from typing import Any

TABLE = "audit_auditevent"

_POSTGRES_INSTALL = [
    """
    CREATE OR REPLACE FUNCTION dlo_audit_append_only() RETURNS trigger AS $$
    BEGIN
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
_SQLITE_INSTALL = [
    f"""CREATE TRIGGER IF NOT EXISTS dlo_audit_no_update BEFORE UPDATE ON {TABLE}
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


def install(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, install=True):
            cursor.execute(sql)


def drop(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, install=False):
            cursor.execute(sql)
