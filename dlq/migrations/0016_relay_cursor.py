"""The relay's cursor (``ReplayPlan.claimed_through``, ``dlq.plans.relay_items``).

A plan the relay worked on before this migration gets its cursor past the last item published
so far: first attempts were claimed in plan order, so every item not yet published lies above
it, and no item below it counts as in flight. Only unfinished plans, one aggregate each; the
plan table is small and the item table is only read.
"""

from django.db import migrations, models
from django.db.models import Max

FINISHED = ("done", "done_failures", "cancelled")


def place_cursors(apps, schema_editor):  # type: ignore[no-untyped-def]
    plan_model = apps.get_model("dlq", "ReplayPlan")
    item_model = apps.get_model("dlq", "ReplayItem")
    for plan_id in plan_model.objects.exclude(status__in=FINISHED).values_list("pk", flat=True):
        last = item_model.objects.filter(plan_id=plan_id, publishes__gt=0).aggregate(
            last=Max("position")
        )["last"]
        if last is not None:
            plan_model.objects.filter(pk=plan_id).update(claimed_through=last + 1)


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0015_entry_state"),
    ]

    operations = [
        migrations.AddField(
            model_name="replayplan",
            name="claimed_through",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(place_cursors, migrations.RunPython.noop, elidable=True),
    ]
