"""Sign-in with failed-attempt rate limiting per IP and per (IP, account).

Usernames are normalised (NFKC, trimmed) before both the password check and the throttle key,
and the per-account counter is keyed on the account the spelling actually matches (its primary
key), so ``'user '``, a fullwidth ``ｕｓｅｒ`` or a dotless ``ı`` that the database's
case-insensitive match maps to ``I`` is the same account and the same counter, not a fresh
five attempts. A spelling that matches no account is keyed on its case-folded form.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache

from audit.actions import Actor, do_record_denial
from dashboard.proxy import client_address


def normalise_username(raw: str) -> str:
    """What the user meant: compatibility forms folded (NFKC) and surrounding space trimmed."""
    return unicodedata.normalize("NFKC", raw).strip()[:150]


def _canonical_username(name: str) -> str:
    """The stored spelling of ``name``: an exact match, else the one case-insensitive match
    (two accounts differing only in case keep needing their exact spelling)."""
    users = get_user_model()._default_manager
    field = get_user_model().USERNAME_FIELD
    if users.filter(**{field: name}).exists():
        return name
    matches = list(users.filter(**{f"{field}__iexact": name}).values_list(field, flat=True)[:2])
    return str(matches[0]) if len(matches) == 1 else name


def _account(name: str) -> str:
    """The throttle's name for the account ``name`` signs in to: the primary key of the one
    account the password check will use, else the case-folded spelling."""
    users = get_user_model()._default_manager
    field = get_user_model().USERNAME_FIELD
    pks = list(users.filter(**{field: _canonical_username(name)}).values_list("pk", flat=True))
    return f"id:{pks[0]}" if len(pks) == 1 else f"name:{name.casefold()}"


def _keys(ip: str, username: str) -> list[str]:
    return [f"dlo:login-fail:ip:{ip}", f"dlo:login-fail:user:{ip}:{_account(username)}"]


class RateLimitedAuthenticationForm(AuthenticationForm):
    """Refuses to check passwords once an IP (or IP + username) has failed too often."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "throttled": "Too many failed sign-in attempts. Wait %(minutes)d minutes and try again.",
    }

    def clean(self) -> dict[str, Any]:
        ip = (client_address(self.request) if self.request else None) or "unknown"
        username = normalise_username(str(self.data.get("username", "")))
        keys = _keys(ip, username)
        counts = cache.get_many(keys)
        ip_limit = settings.LOGIN_RATE_LIMIT * 4
        if (
            counts.get(keys[0], 0) >= ip_limit
            or counts.get(keys[1], 0) >= settings.LOGIN_RATE_LIMIT
        ):
            do_record_denial(
                "auth.login_throttled",
                actor=Actor(None, username, ip if ip != "unknown" else None),
                target_type="auth.user",
                target_repr=username,
                reason="too many failed sign-ins",
            )
            raise forms.ValidationError(
                self.error_messages["throttled"],
                code="throttled",
                params={"minutes": max(1, settings.LOGIN_RATE_WINDOW_S // 60)},
            )
        if self.cleaned_data.get("username"):  # set only when it passed the field's validators
            self.cleaned_data["username"] = _canonical_username(self.cleaned_data["username"])
        try:
            return super().clean()
        except forms.ValidationError:
            for key in keys:
                cache.add(key, 0, timeout=settings.LOGIN_RATE_WINDOW_S)
                try:
                    cache.incr(key)
                except ValueError:
                    cache.set(key, 1, timeout=settings.LOGIN_RATE_WINDOW_S)
            raise
