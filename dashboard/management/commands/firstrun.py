"""``firstrun``: on a database without users, create the first admin with a one-time password."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from audit.actions import Actor
from dashboard.actions import do_create_first_admin


class Command(BaseCommand):
    help = "Create the first admin user with a random password if no user exists yet."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument(
            "--port", type=int, default=8000, help="The port `make run` serves on (PORT)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.audit_key()
        url = f"http://127.0.0.1:{options['port']}/login/"
        user_model = get_user_model()
        if user_model.objects.exists():
            self.stdout.write(f"Users exist already: sign in at {url}")
            return
        password = secrets.token_urlsafe(12)
        user = do_create_first_admin(options["username"], password, actor=Actor.system("firstrun"))
        bar = "=" * 64
        self.stdout.write(
            f"{bar}\n First run: created the admin user.\n"
            f"   URL:      {url}\n"
            f"   Username: {user.get_username()}\n"
            f"   Password: {password}   (shown once: change it in the admin)\n"
            f" Next: run `make demo` in a second terminal for demo channels and traffic\n"
            f"   on the RabbitMQ, Redis and NATS it finds on loopback.\n{bar}"
        )

    def audit_key(self) -> None:
        """The audit checkpoint signing key named by DLO_AUDIT_SIGNING_KEY (``make run``
        points it at .audit/signing.key) and the events' MAC key (DLO_AUDIT_MAC_KEY): created
        when missing, and said where."""
        from django.conf import settings

        from audit import mac
        from audit.checkpoints import keygen, public_text

        mac_path = settings.DLO_AUDIT_MAC_KEY
        if mac_path and not Path(mac_path).exists():
            mac.keygen(Path(mac_path))
            self.stdout.write(
                f"Audit events: created the MAC key {Path(mac_path).resolve()} (keep it out "
                "of the database and its backups: whoever holds it can add believable events)."
            )
        path = settings.DLO_AUDIT_SIGNING_KEY
        if not path or Path(path).exists():
            return
        public = keygen(Path(path))
        self.stdout.write(
            f"Audit checkpoints: created the signing key {Path(path).resolve()} (public key "
            f"{path}.pub: {public_text(public)}); checkpoints go to "
            f"{Path(settings.DLO_AUDIT_CHECKPOINT_DIR or '.').resolve()} within "
            f"{settings.DLO_AUDIT_CHECKPOINT_INTERVAL_S} s of new events. "
            "Keep the public key somewhere the database's operators cannot change it."
        )
