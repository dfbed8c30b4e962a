from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dlq.management.commands._bulk import (
    actor,
    add_selection_arguments,
    frozen,
    selection,
    write_preview,
)
from dlq.models import DeadLetter, PlanKind
from dlq.plans.actions import PlanRefused, do_create_plan
from dlq.plans.preview import build_preview


class Command(BaseCommand):
    help = "Preview or (--yes) discard dead letters with a reason (audited per entry)."

    def add_arguments(self, parser: CommandParser) -> None:
        add_selection_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        chosen = selection(options)
        preview = build_preview(PlanKind.DISCARD, chosen, DeadLetter.objects.all())
        write_preview(self.stdout, preview)
        if not options["yes"]:
            self.stdout.write("preview only: add --reason and --yes to discard")
            return
        if not options["reason"]:
            raise CommandError("Give --reason.")
        try:
            plan, _ = do_create_plan(
                PlanKind.DISCARD,
                chosen,
                DeadLetter.objects.all(),
                actor=actor(options, "dlq.discard_deadletter"),
                reason=options["reason"],
            )
        except PlanRefused as exc:
            raise CommandError(str(exc)) from exc
        plan = frozen(self.stdout, plan)
        self.stdout.write(
            f"discard plan #{plan.pk}: {plan.total} entries, {plan.discarded} discarded, "
            f"{plan.status}"
        )
