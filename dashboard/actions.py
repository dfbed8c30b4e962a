"""Project-level state changes: API tokens and the first admin, atomic and audited."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from audit.actions import Actor, record
from dashboard.models import ApiToken


@transaction.atomic
def do_create_api_token(user: Any, name: str, *, actor: Actor) -> tuple[ApiToken, str]:
    """Issue a token for ``user``; returns the row and the raw token (shown once)."""
    token, raw = ApiToken.issue(user, name)
    record(
        "api.token.create",
        actor=actor,
        target=token,
        after={"user": user.get_username(), "name": token.name},
    )
    return token, raw


@transaction.atomic
def do_revoke_api_tokens(prefix: str, *, actor: Actor) -> int:
    """Revoke every active token starting with ``prefix``; returns how many."""
    tokens = list(ApiToken.objects.select_for_update().filter(prefix=prefix, revoked=False))
    for token in tokens:
        ApiToken.objects.filter(pk=token.pk).update(revoked=True)
        record("api.token.revoke", actor=actor, target=token)
    return len(tokens)


@transaction.atomic
def do_create_first_admin(username: str, password: str, *, actor: Actor) -> Any:
    """Create the first superuser (only ``firstrun`` calls this, on an empty user table)."""
    user = get_user_model().objects.create_superuser(username, "", password)
    record(
        "auth.user.create",
        actor=actor,
        target=user,
        after={"username": user.get_username(), "is_superuser": True},
    )
    return user
