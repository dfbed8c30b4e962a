"""``apitoken create USER NAME`` / ``apitoken revoke PREFIX``: manage API tokens."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from audit.actions import Actor, record
from dashboard.models import ApiToken


class Command(BaseCommand):
    help = "Create (printed once) or revoke API tokens for the JSON API and /metrics."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create")
        create.add_argument("username")
        create.add_argument("name")
        revoke = sub.add_parser("revoke")
        revoke.add_argument("prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        actor = Actor.system("apitoken-command")
        if options["action"] == "create":
            user = get_user_model().objects.filter(username=options["username"]).first()
            if user is None:
                raise CommandError(f"no user named {options['username']!r}")
            with transaction.atomic():
                token, raw = ApiToken.issue(user, options["name"])
                record(
                    "api.token.create",
                    actor=actor,
                    target=token,
                    after={"user": user.get_username(), "name": token.name},
                )
            self.stdout.write(f"Token for {user.get_username()} (shown once): {raw}")
            return
        with transaction.atomic():
            tokens = list(ApiToken.objects.filter(prefix=options["prefix"], revoked=False))
            if not tokens:
                raise CommandError(f"no active token starts with {options['prefix']!r}")
            for token in tokens:
                ApiToken.objects.filter(pk=token.pk).update(revoked=True)
                record("api.token.revoke", actor=actor, target=token)
        self.stdout.write(f"Revoked {len(tokens)} token(s).")
