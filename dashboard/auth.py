"""Sign-in with failed-attempt rate limiting per IP and per (IP, username)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache

from audit.actions import Actor, do_record_denial


def _keys(ip: str, username: str) -> list[str]:
    return [f"dlo:login-fail:ip:{ip}", f"dlo:login-fail:user:{ip}:{username.lower()}"]


class RateLimitedAuthenticationForm(AuthenticationForm):
    """Refuses to check passwords once an IP (or IP + username) has failed too often."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "throttled": "Too many failed sign-in attempts. Wait %(minutes)d minutes and try again.",
    }

    def clean(self) -> dict[str, Any]:
        ip = (self.request.META.get("REMOTE_ADDR") if self.request else None) or "unknown"
        username = str(self.data.get("username", ""))[:150]
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
