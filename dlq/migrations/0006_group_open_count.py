"""Failure groups count their open entries (not yet replayed or discarded), and partial
indexes serve the open counts per group and per channel (board, alerts, group list)."""

from django.db import migrations, models

BACKFILL = """
UPDATE dlq_failuregroup SET open_count = (
    SELECT COUNT(*) FROM dlq_deadletter
    WHERE dlq_deadletter.group_id = dlq_failuregroup.id
      AND dlq_deadletter.status NOT IN ('replayed', 'discarded')
)
"""


class Migration(migrations.Migration):
    dependencies = [
        ("channels_registry", "0004_alter_broker_management_url"),
        ("dlq", "0005_replay_roles"),
    ]

    operations = [
        migrations.AddField(
            model_name="failuregroup",
            name="open_count",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(
                condition=models.Q(("status__in", ("replayed", "discarded")), _negated=True),
                fields=["group"],
                name="dlq_entry_open_group",
            ),
        ),
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(
                condition=models.Q(("status__in", ("replayed", "discarded")), _negated=True),
                fields=["channel", "source"],
                name="dlq_entry_open_channel",
            ),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
