"""Login, logout and failed-login events, recorded through ``record``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db import transaction
from django.dispatch import receiver

from audit.actions import Actor, record
from audit.models import Outcome
from dashboard.proxy import client_address


def _ip(request: Any) -> str | None:
    return client_address(request) if request is not None else None


@receiver(user_logged_in)
def on_login(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    with transaction.atomic():
        record("auth.login", actor=Actor.for_user(user, _ip(request)), target=user)


@receiver(user_logged_out)
def on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        with transaction.atomic():
            record("auth.logout", actor=Actor.for_user(user, _ip(request)), target=user)


@receiver(user_login_failed)
def on_login_failed(
    sender: Any, credentials: dict[str, Any], request: Any = None, **kw: Any
) -> None:
    username = str(credentials.get("username", ""))[:150]
    with transaction.atomic():
        record(
            "auth.login_failed",
            actor=Actor(None, username, _ip(request)),
            target_type="auth.user",
            target_repr=username,
            outcome=Outcome.DENIED,
        )
