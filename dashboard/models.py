"""API tokens for the JSON API (``/api/``) and ``/metrics``."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import string

from django.conf import settings
from django.db import models
from django.utils import timezone

PREFIX_ALPHABET = string.ascii_letters + string.digits


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class RevokedBecause(models.TextChoices):
    COMMAND = "command", "revoked by an operator"
    DEACTIVATED = "deactivated", "its user was deactivated"
    PASSWORD_CHANGED = "password_changed", "its user's password changed"


class ApiToken(models.Model):
    """A bearer token acting as its user. Only the SHA-256 of the token is stored; the token
    itself is shown once, when created (``manage.py apitoken create``). It works until
    ``expires_at`` (at most ``DLO_API_TOKEN_MAX_DAYS`` after creation), while it is not revoked
    and its user is active; deactivating the user or changing their password revokes it."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=8, editable=False)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_because = models.CharField(
        max_length=20, choices=RevokedBecause.choices, blank=True, default=""
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def status(self) -> str:
        if self.revoked:
            return "revoked"
        return "expired" if self.expires_at <= timezone.now() else "active"

    @classmethod
    def issue(cls, user: object, name: str, days: int | None = None) -> tuple[ApiToken, str]:
        """A new token valid for ``days`` (default ``DLO_API_TOKEN_DAYS``); more than
        ``DLO_API_TOKEN_MAX_DAYS`` or less than one day is a ``ValueError``."""
        days = settings.DLO_API_TOKEN_DAYS if days is None else days
        if not 1 <= days <= settings.DLO_API_TOKEN_MAX_DAYS:
            raise ValueError(
                f"a token lasts 1 to {settings.DLO_API_TOKEN_MAX_DAYS} days "
                "(DLO_API_TOKEN_MAX_DAYS)"
            )
        # The prefix is what a person types to revoke the token, so it is letters and digits
        # only: a prefix starting with "-" would be read as an option by the command line.
        prefix = "".join(secrets.choice(PREFIX_ALPHABET) for _ in range(8))
        raw = "dlo_" + prefix + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user,
            name=name,
            prefix=raw[4:12],
            token_hash=hash_token(raw),
            expires_at=timezone.now() + dt.timedelta(days=days),
        )
        return token, raw
