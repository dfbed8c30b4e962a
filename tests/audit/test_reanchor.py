"""Existing installations: migration 0004 re-anchors the log honestly. Format-1 events stay
exactly as they were and keep verifying under their rule; the migration records what it did as
an event (including format-1 events that already failed, e.g. a jsonb false alarm), and the new
events chain on from the old head."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from audit.actions import Actor, record, verify_chain
from audit.chain import GENESIS, canonical_time, compute_hash
from audit.models import AuditEvent
from audit.sealer import seal
from tests.conftest import migrate_to

BEFORE = [("audit", "0003_outcome_seq_index")]


@pytest.mark.django_db(transaction=True)
def test_migration_reanchors_format_1_events_without_rewriting_them() -> None:
    executor = migrate_to(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    event_model, head_model = (
        old.get_model("audit", "AuditEvent"),
        old.get_model("audit", "AuditHead"),
    )
    prev = GENESIS
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for seq, after in enumerate([{"a": 1}, {"backoff_cap_s": 1.0e16}, {"c": "ok"}], start=1):
        fields = {
            "seq": seq, "created_at": now, "actor_id": None, "actor_username": "old",
            "source_ip": None, "action": "test.v1", "target_type": "", "target_id": "",
            "target_repr": "", "channel_slug": "", "reason": "", "before": None,
            "after": after, "changes": None, "outcome": "success", "prev_hash": prev,
        }  # fmt: skip
        digest = compute_hash({**fields, "created_at": canonical_time(now)})
        event_model.objects.create(**fields, hash=digest)
        prev = digest
    head_model.objects.update_or_create(pk=1, defaults={"seq": 3, "hash": prev})
    stored_before = list(event_model.objects.order_by("seq").values_list("seq", "hash", "after"))

    migrate_to(MigrationExecutor(connection).loader.graph.leaf_nodes())

    legacy = AuditEvent.objects.filter(hash_version=1).order_by("seq")
    assert [(e.seq, e.hash, e.after) for e in legacy] == stored_before  # nothing rewritten
    reanchor = AuditEvent.objects.get(action="audit.reanchor")
    assert reanchor.seq is None  # recorded like any event, sealed by the sealer
    seal()
    reanchor.refresh_from_db()
    assert reanchor.seq == 4 and reanchor.prev_hash == prev
    facts = json.loads(reanchor.detail_json)["after"]
    assert facts["legacy_events"] == 3 and facts["legacy_head_hash"] == prev
    jsonb = connection.vendor == "postgresql"
    assert facts["legacy_failures"] == ([2] if jsonb else [])  # the jsonb false alarm, named
    # Migration 0007_audit_a_mac then anchors the MAC: the events before it carry none.
    mac_anchor = AuditEvent.objects.get(action="audit.mac_anchor")
    assert mac_anchor.seq == 5 and json.loads(mac_anchor.detail_json)["after"] == {
        "events_before": 4
    }
    record("test.after", actor=Actor.system())
    result = verify_chain()
    assert result.ok and result.events == 6, result.summary()
    if jsonb:
        assert any("#2 did not verify when the log was re-anchored" in n for n in result.notes)
