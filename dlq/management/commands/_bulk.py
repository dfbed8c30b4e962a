"""Shared by the ``replay`` and ``discard`` commands: selection, actor and preview output."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser, OutputWrapper

from audit.actions import Actor
from dlq.models import DeadLetter
from dlq.plans.preview import Preview, Selection
from dlq.triage.filters import EntryFilter, parse_id


def add_selection_arguments(parser: CommandParser) -> None:
    parser.add_argument("--channel", help="Channel slug (required unless --plan).")
    parser.add_argument("--group", type=int, help="Only this failure group.")
    parser.add_argument("--ids", help="Only these entry ids, comma-separated.")
    parser.add_argument("--status", help="Only entries in this status (e.g. new).")
    parser.add_argument("--reason", help="Why (required to act).")
    parser.add_argument("--user", help="Act as this user (checked for the permission).")
    parser.add_argument("--yes", action="store_true", help="Act; without it only preview.")


def selection(options: dict[str, Any]) -> Selection:
    if not options.get("channel"):
        raise CommandError("Give --channel SLUG.")
    params = {"channel": options["channel"], "group": options.get("group") or "",
              "status": options.get("status") or ""}  # fmt: skip
    ids = []
    for raw in (options.get("ids") or "").split(","):
        if raw.strip():
            pk = parse_id(raw)
            if pk is None:
                raise CommandError(f"--ids: {raw!r} is not an entry id.")
            ids.append(pk)
    chosen = Selection(EntryFilter.from_params(params), sorted(set(ids)))
    if ids:
        # Ids stay within the channel (and group) given, never "any entry with this id".
        allowed = set(chosen.filter.apply(DeadLetter.objects.filter(pk__in=ids)).values_list(
            "pk", flat=True))  # fmt: skip
        if allowed != set(ids):
            missing = ", ".join(str(i) for i in sorted(set(ids) - allowed))
            raise CommandError(f"Not entries of this channel/group: {missing}")
    return chosen


def actor(options: dict[str, Any], permission: str) -> Actor:
    """The named user (who must hold the permission), else the system actor for the CLI."""
    name = options.get("user")
    if not name:
        return Actor.system("cli")
    user = get_user_model().objects.filter(username=name, is_active=True).first()
    if user is None:
        raise CommandError(f"No active user {name!r}.")
    if not user.has_perm(permission):
        raise CommandError(f"{name} lacks {permission}.")
    return Actor.for_user(user)


def write_preview(out: OutputWrapper, preview: Preview) -> None:
    data = preview.as_json()
    out.write(f"{preview.kind} preview: channel {data['channel']}, {preview.matched} matching, "
              f"{preview.eligible} to {preview.kind}, target {data['target'] or '-'}")  # fmt: skip
    for why, n in preview.excluded.items():
        out.write(f"  skipped {n}: {why}")
    for w in preview.warnings:
        out.write(f"  [{w.level}] {w.code}: {w.message}")
    for e in preview.errors:
        out.write(f"  error: {e}")
    if preview.needs_approval(False):
        out.write("  needs a second person's approval (four eyes) before it runs")


def frozen(out: OutputWrapper, plan: Any) -> Any:
    """A plan still freezing (a large selection) is frozen here, in the foreground."""
    from dlq.models import PlanStatus
    from dlq.plans import freeze

    if plan.status != PlanStatus.FREEZING:
        return plan
    out.write(f"{plan}: freezing {plan.total} entries in chunks")
    return freeze.freeze_to_end(plan.pk)
