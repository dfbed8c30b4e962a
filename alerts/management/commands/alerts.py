"""``alerts evaluate`` / ``alerts deliver``: run one evaluation or delivery round now."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from alerts.evaluate import do_evaluate_alerts
from alerts.notify import do_deliver_notifications


class Command(BaseCommand):
    help = "Evaluate the alert rules once, or deliver due notifications once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("what", choices=["evaluate", "deliver"])

    def handle(self, *args: Any, **options: Any) -> None:
        if options["what"] == "evaluate":
            self.stdout.write(do_evaluate_alerts().summary())
        else:
            self.stdout.write(do_deliver_notifications().summary())
