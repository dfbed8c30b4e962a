"""API tokens for the JSON API (``/api/``) and ``/metrics``."""

from __future__ import annotations

import hashlib
import secrets
import string

from django.conf import settings
from django.db import models

PREFIX_ALPHABET = string.ascii_letters + string.digits


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class ApiToken(models.Model):
    """A bearer token acting as its user. Only the SHA-256 of the token is stored; the token
    itself is shown once, when created (``manage.py apitoken create``)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=8, editable=False)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, user: object, name: str) -> tuple[ApiToken, str]:
        # The prefix is what a person types to revoke the token, so it is letters and digits
        # only: a prefix starting with "-" would be read as an option by the command line.
        prefix = "".join(secrets.choice(PREFIX_ALPHABET) for _ in range(8))
        raw = "dlo_" + prefix + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user, name=name, prefix=raw[4:12], token_hash=hash_token(raw)
        )
        return token, raw
