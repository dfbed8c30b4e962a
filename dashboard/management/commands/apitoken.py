"""``apitoken create USER NAME [--days N]`` / ``apitoken revoke PREFIX`` / ``apitoken list``:
manage API tokens."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.actions import Actor
from dashboard.actions import do_create_api_token, do_revoke_api_tokens
from dashboard.models import ApiToken

LIST_LIMIT = 1000


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value is not None else "never"


class Command(BaseCommand):
    help = "Create (printed once), list or revoke API tokens for the JSON API and /metrics."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create")
        create.add_argument("username")
        create.add_argument("name")
        create.add_argument(
            "--days",
            type=int,
            default=None,
            help="how long it lasts (default DLO_API_TOKEN_DAYS, at most DLO_API_TOKEN_MAX_DAYS)",
        )
        revoke = sub.add_parser("revoke")
        revoke.add_argument(
            "prefix",
            help="the 8 characters after dlo_; for an older token whose prefix "
            'starts with "-", put -- before it',
        )
        listing = sub.add_parser("list", help="every token: status, expiry and last use")
        listing.add_argument("--user", default="", help="only this user's tokens")

    def handle(self, *args: Any, **options: Any) -> None:
        actor = Actor.system("apitoken-command")
        if options["action"] == "create":
            user = get_user_model().objects.filter(username=options["username"]).first()
            if user is None:
                raise CommandError(f"no user named {options['username']!r}")
            try:
                token, raw = do_create_api_token(
                    user, options["name"], actor=actor, days=options["days"]
                )
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(
                f"Token for {user.get_username()} (shown once, expires "
                f"{_when(token.expires_at)}): {raw}"
            )
            return
        if options["action"] == "list":
            self._list(options["user"])
            return
        revoked = do_revoke_api_tokens(options["prefix"], actor=actor)
        if not revoked:
            raise CommandError(f"no active token starts with {options['prefix']!r}")
        self.stdout.write(f"Revoked {revoked} token(s).")

    def _list(self, username: str) -> None:
        tokens = ApiToken.objects.select_related("user").order_by("-created_at", "-pk")
        if username:
            tokens = tokens.filter(user__username=username)
        rows = list(tokens[: LIST_LIMIT + 1])
        self.stdout.write("prefix    user  name  status  created  expires  last used")
        for token in rows[:LIST_LIMIT]:
            status = token.status
            if token.revoked_because:
                status += f" ({token.get_revoked_because_display()})"
            self.stdout.write(
                f"{token.prefix}  {token.user.get_username()}  {token.name!r}  {status}  "
                f"{_when(token.created_at)}  {_when(token.expires_at)}  "
                f"{_when(token.last_used_at)}"
            )
        shown = min(len(rows), LIST_LIMIT)
        more = f" (the newest {LIST_LIMIT}; filter with --user)" if len(rows) > LIST_LIMIT else ""
        self.stdout.write(f"{shown} token(s){more}.")
