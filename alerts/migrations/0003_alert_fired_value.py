"""An alert keeps the value it fired at, so its text can show that and the value now."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("alerts", "0002_roles"),
    ]

    operations = [
        migrations.AddField(
            model_name="alert",
            name="fired_value",
            field=models.FloatField(blank=True, null=True),
        ),
    ]
