"""Events carry the application's MAC (``audit.mac``); the sealer refuses rows without one.

Events recorded before this migration have no MAC. The migration records, as an ordinary event
at the end of the log, the MAC anchor: the number of events that existed (``events_before``).
``audit verify`` accepts events without a MAC only *before* that anchor, and only one anchor,
placed exactly after them; every event after it needs a valid MAC. A log that was empty at the
migration gets no anchor: all its events need one. The anchor itself has no MAC (the key may not
be readable where migrations run); its place in the chain is what it proves.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from audit import triggers

ANCHOR = "audit.mac_anchor"


def anchor(apps: Any, schema_editor: Any) -> None:
    # Frozen here (data migrations never import live code): the event's two canonical texts,
    # as audit.actions._event_fields builds them for a system event.
    import datetime as dt
    import json

    event_model = apps.get_model("audit", "AuditEvent")
    count = event_model.objects.count()
    if not count:
        return
    now = dt.datetime.now(dt.UTC)
    when = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    after = {"events_before": count}
    reason = (
        "Events now carry the application's MAC; the events before this one were recorded "
        "without it."
    )
    repr_ = f"MAC required after {count} events"

    def canonical(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    index = {
        "action": ANCHOR, "actor": "migration", "channel": "", "created_at": when,
        "outcome": "success", "plan": "", "target_id": "", "target_type": "audit.chain",
    }  # fmt: skip
    detail = {
        "actor_id": None, "after": after, "before": None, "changes": None, "reason": reason,
        "source_ip": None, "target_repr": repr_,
    }  # fmt: skip
    # Unsealed rows of the old code (no MAC) are sealed before the anchor (they have lower
    # ids): ``events_before`` counts them too.
    event_model.objects.create(
        created_at=now, actor_id=None, actor_username="migration", source_ip=None,
        action=ANCHOR, target_type="audit.chain", target_id="", target_repr=repr_,
        channel_slug="", reason=reason, before=None, after=after, changes=None,
        outcome="success", plan_id="", seq=None, prev_hash="", hash=None, hash_version=2,
        index_json=canonical(index), detail_json=canonical(detail), mac="",
    )  # fmt: skip


def drop_triggers(apps: Any, schema_editor: Any) -> None:
    triggers.drop(schema_editor.connection)


def install_triggers(apps: Any, schema_editor: Any) -> None:
    triggers.install(schema_editor.connection)


def install_0004_triggers(apps: Any, schema_editor: Any) -> None:
    triggers.install_0004(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("audit", "0006_audit_b_tree_witness")]

    operations = [
        migrations.RunPython(drop_triggers, install_0004_triggers),
        migrations.AddField(
            model_name="auditevent",
            name="mac",
            field=models.CharField(blank=True, default="", max_length=96),
            preserve_default=False,
        ),
        migrations.AddConstraint(
            model_name="auditevent",
            constraint=models.UniqueConstraint(
                condition=models.Q(("mac", ""), _negated=True),
                fields=("mac",),
                name="audit_mac_unique",
            ),
        ),
        migrations.AddField(
            model_name="audithead",
            name="created_max",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="RefusedEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("event_id", models.BigIntegerField(unique=True)),
                ("refused_at", models.DateTimeField(auto_now_add=True)),
                ("problem", models.TextField()),
            ],
        ),
        migrations.RunPython(anchor, migrations.RunPython.noop),
        migrations.RunPython(install_triggers, drop_triggers),
    ]
