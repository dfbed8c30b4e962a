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
from dlq.models import DeadLetter, PlanKind, PlanStatus, ReplayPlan
from dlq.plans import relay
from dlq.plans.actions import PlanRefused, do_approve_plan, do_create_plan
from dlq.plans.preview import DEFAULT_VELOCITY, build_preview


class Command(BaseCommand):
    help = "Preview, plan (--yes) or run (--plan ID --run) a replay of dead letters."

    def add_arguments(self, parser: CommandParser) -> None:
        add_selection_arguments(parser)
        parser.add_argument("--rate", type=float, help="Messages per second (default 100).")
        parser.add_argument("--canary", type=int, default=0, help="Send this many, then wait.")
        parser.add_argument("--canary-wait", type=float, default=30.0, help="Seconds to wait.")
        parser.add_argument("--override", help="Override a blocking declaration: its reason.")
        parser.add_argument("--plan", type=int, help="An existing plan (with --run).")
        parser.add_argument("--run", action="store_true", help="Relay in this process.")
        parser.add_argument(
            "--approve", action="store_true", help="Approve --plan ID as --user (four eyes)."
        )
        parser.add_argument("--max-seconds", type=float, default=3600.0)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["plan"] and options["approve"]:
            if not options["user"] or not options["reason"]:
                raise CommandError("--approve needs --user (the second person) and --reason.")
            try:
                plan = do_approve_plan(
                    options["plan"],
                    actor=actor(options, "dlq.approve_bulk_action"),
                    reason=options["reason"],
                )
            except PlanRefused as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"{plan}: approved by {plan.approved_by_username}, {plan.status}")
            if options["run"]:
                self._run(plan.pk, options["max_seconds"])
            return
        if options["plan"]:
            if not options["run"]:
                raise CommandError("--plan needs --run (or --approve).")
            self._run(options["plan"], options["max_seconds"])
            return
        chosen = selection(options)
        preview = build_preview(PlanKind.REPLAY, chosen, DeadLetter.objects.all())
        write_preview(self.stdout, preview)
        if not options["yes"]:
            self.stdout.write("preview only: add --reason and --yes to freeze the plan")
            return
        if not options["reason"]:
            raise CommandError("Give --reason.")
        try:
            plan, _ = do_create_plan(
                PlanKind.REPLAY,
                chosen,
                DeadLetter.objects.all(),
                actor=actor(options, "dlq.replay_deadletter"),
                reason=options["reason"],
                velocity=options["rate"] or DEFAULT_VELOCITY,
                canary_size=options["canary"],
                canary_wait_s=options["canary_wait"],
                override=bool(options["override"]),
                override_reason=options["override"] or "",
            )
        except PlanRefused as exc:
            raise CommandError(str(exc)) from exc
        plan = frozen(self.stdout, plan)
        self.stdout.write(f"replay plan #{plan.pk}: {plan.total} entries, {plan.status}")
        if options["run"] and plan.status == PlanStatus.QUEUED:
            self._run(plan.pk, options["max_seconds"])

    def _run(self, plan_id: int, max_seconds: float) -> None:
        frozen(self.stdout, ReplayPlan.objects.get(pk=plan_id))
        result = relay.run_plan(plan_id, max_seconds=max_seconds)
        if not result.claimed:
            raise CommandError(f"Plan #{plan_id} is not runnable or another relay holds it.")
        self.stdout.write(
            f"replay plan #{plan_id}: {result.published} published, {result.confirmed} "
            f"confirmed, {result.failed} failed, status {result.status}"
        )
