from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("channels_registry", "0013_truth_dlq_retained"),
    ]

    operations = [
        migrations.AddField(
            model_name="channelhealth",
            name="retry_waiting",
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name="channelhealth",
            name="retry_unknown",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
    ]
