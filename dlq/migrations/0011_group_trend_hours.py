"""The groups page's trend from stored hourly counts per group (``dlq.capture.trends``).

Fills the hours of both trend windows from the entries already stored, then drops the
(group, dead_lettered_at) index of the dead-letter table that only the old per-request count
used (one index less for every ingested row).
"""

import datetime as dt

import django.db.models.deletion
from django.db import migrations, models
from django.db.models.functions import TruncHour
from django.utils import timezone


def fill_hours(apps, schema_editor):
    DeadLetter = apps.get_model("dlq", "DeadLetter")
    GroupHour = apps.get_model("dlq", "GroupHour")
    # The same cut-off as ``dlq.capture.trends.windows``: the current hour and the 47 before it.
    hour = timezone.now().astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    since = hour - dt.timedelta(hours=47)
    rows = (
        DeadLetter.objects.filter(group__isnull=False, dead_lettered_at__gte=since)
        .annotate(hour=TruncHour("dead_lettered_at", tzinfo=dt.UTC))
        .values("group_id", "hour")
        .annotate(n=models.Count("id"))
        .order_by()
    )
    GroupHour.objects.bulk_create(
        (GroupHour(group_id=r["group_id"], hour=r["hour"], count=r["n"]) for r in rows.iterator()),
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("channels_registry", "0011_broker_url_env_help"),
        ("dlq", "0010_group_trend_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="GroupHour",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("hour", models.DateTimeField(db_index=True)),
                ("count", models.BigIntegerField()),
                (
                    "group",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="dlq.failuregroup",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("group", "hour"), name="dlq_grouphour_unique")
                ],
            },
        ),
        migrations.RunPython(fill_hours, migrations.RunPython.noop),
        migrations.RemoveIndex(model_name="deadletter", name="dlq_entry_group_dead_at"),
        migrations.AddIndex(
            model_name="failuregroup",
            index=models.Index(
                condition=models.Q(("count__gt", 0)),
                fields=["-open_count", "-last_seen", "-id"],
                name="dlq_group_triage_order",
            ),
        ),
    ]
