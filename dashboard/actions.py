"""Project-level state changes: API tokens and the first admin, atomic and audited."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit.actions import Actor, record
from dashboard.models import ApiToken, RevokedBecause


@transaction.atomic
def do_create_api_token(
    user: Any, name: str, *, actor: Actor, days: int | None = None
) -> tuple[ApiToken, str]:
    """Issue a token for ``user`` lasting ``days`` (default ``DLO_API_TOKEN_DAYS``, at most
    ``DLO_API_TOKEN_MAX_DAYS``: ``ValueError`` past it); returns the row and the raw token
    (shown once)."""
    token, raw = ApiToken.issue(user, name, days)
    record(
        "api.token.create",
        actor=actor,
        target=token,
        after={
            "user": user.get_username(),
            "name": token.name,
            "expires_at": token.expires_at.isoformat(),
        },
    )
    return token, raw


def _revoke(tokens: QuerySet[ApiToken], because: RevokedBecause, actor: Actor) -> int:
    """Revoke each unrevoked token of ``tokens``, one audit event each; returns how many."""
    now = timezone.now()
    revoked = 0
    for token in tokens.select_for_update().filter(revoked=False).order_by("pk"):
        claimed = ApiToken.objects.filter(pk=token.pk, revoked=False).update(
            revoked=True, revoked_at=now, revoked_because=because
        )
        if claimed:
            revoked += 1
            record(
                "api.token.revoke",
                actor=actor,
                target=token,
                reason=because.label,
                after={"user": token.user.get_username(), "revoked_because": because.value},
            )
    return revoked


@transaction.atomic
def do_revoke_api_tokens(prefix: str, *, actor: Actor) -> int:
    """Revoke every active token starting with ``prefix``; returns how many."""
    tokens = ApiToken.objects.select_related("user").filter(prefix=prefix)
    return _revoke(tokens, RevokedBecause.COMMAND, actor)


@transaction.atomic
def do_revoke_user_api_tokens(user: Any, because: RevokedBecause, *, actor: Actor) -> int:
    """Revoke every token of ``user`` (deactivated, or a new password); returns how many."""
    tokens = ApiToken.objects.select_related("user").filter(user_id=user.pk)
    return _revoke(tokens, because, actor)


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
