"""Format 2 of the audit log: unsealed events, stored canonical texts, a Merkle tree.

Existing events are not touched: they keep their format-1 hashes (``hash_version=1``) and
verify as before. The migration only reads them to build the Merkle tree's right edge over
them (each leaf is the hash of their stored format-1 hash) and then records, as an ordinary
event, that it re-anchored the log: how many events, the head it found, and which of them did
not verify under the old rule at that moment (a false alarm from PostgreSQL's jsonb, or real
tampering before the upgrade), so that the verifier reports those instead of stopping there.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from audit import triggers
from audit.chain import MerkleFrontier, canonical_time, compute_hash, legacy_leaf

MAX_LISTED = 1000


def reanchor(apps: Any, schema_editor: Any) -> None:
    from django.utils import timezone

    from audit.actions import Actor, _event_fields  # pure: builds the row's fields

    connection = schema_editor.connection
    triggers.drop(connection)
    event_model = apps.get_model("audit", "AuditEvent")
    head_model = apps.get_model("audit", "AuditHead")
    frontier = MerkleFrontier()
    failures: list[int] = []
    failed = 0
    last_seq, last_hash = 0, ""
    names = [f.name for f in event_model._meta.concrete_fields if f.name != "id"]
    for row in event_model.objects.order_by("seq").values(*names).iterator(chunk_size=5000):
        fields = {**row, "created_at": canonical_time(row["created_at"])}
        if fields["source_ip"] is not None:
            fields["source_ip"] = str(fields["source_ip"])
        if compute_hash(fields) != row["hash"]:
            failed += 1
            if len(failures) < MAX_LISTED:
                failures.append(row["seq"])
        frontier.append(legacy_leaf(row["hash"]))
        last_seq, last_hash = row["seq"], row["hash"]
    head, _ = head_model.objects.get_or_create(pk=1, defaults={"seq": 0, "hash": ""})
    if frontier.size and head.seq == frontier.size:
        head.frontier = frontier.dumps()
        head.save(update_fields=["frontier"])
    if frontier.size:
        event = _event_fields(
            now=timezone.now(),
            actor=Actor(None, "migration", None),
            action="audit.reanchor",
            target_type="audit.chain",
            target_id="",
            target_repr=f"re-anchored {frontier.size} format-1 events",
            channel_slug="",
            reason=(
                "Audit log format 2: events now store the canonical text that is hashed, and a "
                "Merkle tree over all events anchors signed checkpoints. Events up to the head "
                "below keep format 1 and verify under its rule; none was changed."
            ),
            before=None,
            after={
                "legacy_events": frontier.size,
                "legacy_head_seq": last_seq,
                "legacy_head_hash": last_hash,
                "legacy_root": frontier.root(),
                "legacy_failures": failures,
                "legacy_failure_count": failed,
            },
            changes=None,
            outcome="success",
        )
        event.pop("mac", None)  # a later column (0007_audit_a_mac)
        event_model.objects.create(**event)
    triggers.install_0004(connection)


def backwards(apps: Any, schema_editor: Any) -> None:
    triggers.drop(schema_editor.connection)
    triggers.install_legacy(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_outcome_seq_index")]

    operations = [
        migrations.AlterField(
            model_name="auditevent",
            name="seq",
            field=models.BigIntegerField(blank=True, null=True, unique=True),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="hash",
            field=models.CharField(blank=True, max_length=64, null=True, unique=True),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="prev_hash",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="hash_version",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="hash_version",
            field=models.PositiveSmallIntegerField(default=2),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="plan_id",
            field=models.CharField(blank=True, default="", max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="auditevent",
            name="index_json",
            field=models.TextField(blank=True, default=""),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="auditevent",
            name="detail_json",
            field=models.TextField(blank=True, default=""),
            preserve_default=False,
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["plan_id", "seq"], name="audit_plan_seq"),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(seq__isnull=True), fields=["id"], name="audit_unsealed"
            ),
        ),
        migrations.AddField(
            model_name="audithead", name="frontier", field=models.TextField(blank=True)
        ),
        migrations.AddField(
            model_name="audithead",
            name="sealed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="audithead",
            name="checkpoint_number",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="audithead",
            name="checkpoint_tree_size",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="audithead",
            name="checkpoint_root",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="audithead",
            name="checkpoint_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="audithead", name="checkpoint_error", field=models.TextField(blank=True)
        ),
        migrations.AddField(
            model_name="audithead",
            name="checkpoint_error_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="chainverification",
            name="checkpoints_matched",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="chainverification", name="notes", field=models.TextField(blank=True)
        ),
        migrations.RunPython(reanchor, backwards),
    ]
