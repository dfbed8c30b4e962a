"""``apitoken create USER NAME`` / ``apitoken revoke PREFIX``: manage API tokens."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.actions import Actor
from dashboard.actions import do_create_api_token, do_revoke_api_tokens


class Command(BaseCommand):
    help = "Create (printed once) or revoke API tokens for the JSON API and /metrics."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create")
        create.add_argument("username")
        create.add_argument("name")
        revoke = sub.add_parser("revoke")
        revoke.add_argument(
            "prefix",
            help="the 8 characters after dlo_; for an older token whose prefix "
            'starts with "-", put -- before it',
        )

    def handle(self, *args: Any, **options: Any) -> None:
        actor = Actor.system("apitoken-command")
        if options["action"] == "create":
            user = get_user_model().objects.filter(username=options["username"]).first()
            if user is None:
                raise CommandError(f"no user named {options['username']!r}")
            _, raw = do_create_api_token(user, options["name"], actor=actor)
            self.stdout.write(f"Token for {user.get_username()} (shown once): {raw}")
            return
        revoked = do_revoke_api_tokens(options["prefix"], actor=actor)
        if not revoked:
            raise CommandError(f"no active token starts with {options['prefix']!r}")
        self.stdout.write(f"Revoked {revoked} token(s).")
