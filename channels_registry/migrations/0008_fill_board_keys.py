import datetime as dt

from django.db import migrations
from django.db.models import F, OuterRef, Subquery
from django.db.models.functions import Lower


def fill_board_keys(apps, schema_editor):  # type: ignore[no-untyped-def]
    """The keys the board sorts on, for health rows written before they existed."""
    Broker = apps.get_model("channels_registry", "Broker")
    Channel = apps.get_model("channels_registry", "Channel")
    ChannelHealth = apps.get_model("channels_registry", "ChannelHealth")
    names = Channel.objects.filter(pk=OuterRef("channel_id")).values(sort=Lower("name"))[:1]
    ChannelHealth.objects.update(sort_name=Subquery(names))
    Channel.objects.filter(health__isnull=False).update(awaiting_health=False)
    polled = ChannelHealth.objects.values_list("channel_id", "state", "dlq_flags")
    summaries = []
    for channel_id, state, dlq_flags in polled.iterator(chunk_size=2000):
        flags = "".join(f" {f}" for f in dlq_flags or [])
        summaries.append(
            Channel(pk=channel_id, board_state=state, board_flags=f"{flags} " if flags else "")
        )
    Channel.objects.bulk_update(summaries, ["board_state", "board_flags"], batch_size=1000)
    for broker in Broker.objects.all():
        limit = max(60.0, 3.0 * broker.poll_interval_s)
        ChannelHealth.objects.filter(channel__broker=broker, updated_at__isnull=False).update(
            stale_at=F("updated_at") + dt.timedelta(seconds=limit)
        )


class Migration(migrations.Migration):
    dependencies = [("channels_registry", "0007_board_order")]

    operations = [migrations.RunPython(fill_board_keys, migrations.RunPython.noop)]
