"""API tokens expire (issue #27 item 7): ``expires_at``, and why and when a token was revoked.

Tokens issued before this migration never expired; they now expire ``DLO_API_TOKEN_DAYS``
(default 90) after the migration runs, so an upgrade breaks no script at once.
"""

import datetime as dt

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def give_old_tokens_an_expiry(apps, schema_editor):
    days = int(getattr(settings, "DLO_API_TOKEN_DAYS", 90))
    ApiToken = apps.get_model("dashboard", "ApiToken")
    ApiToken.objects.filter(expires_at__isnull=True).update(
        expires_at=timezone.now() + dt.timedelta(days=days)
    )


class Migration(migrations.Migration):
    dependencies = [("dashboard", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.RunPython(give_old_tokens_an_expiry, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="revoked_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="revoked_because",
            field=models.CharField(
                blank=True,
                choices=[
                    ("command", "revoked by an operator"),
                    ("deactivated", "its user was deactivated"),
                    ("password_changed", "its user's password changed"),
                ],
                default="",
                max_length=20,
            ),
        ),
    ]
