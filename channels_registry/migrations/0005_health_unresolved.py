"""Channel health keeps the stored, unresolved dead letters beside the broker's DLQ depth."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("channels_registry", "0004_alter_broker_management_url"),
    ]

    operations = [
        migrations.AddField(
            model_name="channelhealth",
            name="dlq_unresolved",
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name="channelhealth",
            name="poison_unresolved",
            field=models.BigIntegerField(null=True),
        ),
    ]
