"""A user's API tokens are revoked when the user is deactivated or their password changes.

Why a signal, against the house rule: users change in code this project does not own (the
Django admin's user and password forms, ``changepassword``, password reset), so the change
cannot call an action itself. The receivers only notice the change and call the one action,
``do_revoke_user_api_tokens``, which revokes and audits. Bulk ``QuerySet.update()`` bypasses
signals; a deactivated user's tokens are refused at authentication anyway.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver

from audit.actions import Actor
from dashboard.actions import do_revoke_user_api_tokens
from dashboard.models import RevokedBecause

_WATCHED = {"is_active", "password"}
_PENDING = "_dlo_revoke_tokens_because"


@receiver(pre_save, sender=settings.AUTH_USER_MODEL)
def note_account_change(sender: Any, instance: Any, update_fields: Any = None, **_: Any) -> None:
    """Before a user is saved: was it deactivated, or given a new password?

    ``set_password`` leaves the raw password in ``_password`` until the save; Django's own
    re-hash at sign-in (a hasher upgrade) clears it first, so an upgrade is not a change."""
    setattr(instance, _PENDING, None)
    if instance.pk is None or (update_fields is not None and not _WATCHED & set(update_fields)):
        return
    before = sender._default_manager.filter(pk=instance.pk).values("is_active").first()
    if before is None:
        return
    if before["is_active"] and not instance.is_active:
        setattr(instance, _PENDING, RevokedBecause.DEACTIVATED)
    elif getattr(instance, "_password", None) is not None:
        setattr(instance, _PENDING, RevokedBecause.PASSWORD_CHANGED)


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def revoke_tokens_after_account_change(sender: Any, instance: Any, **_: Any) -> None:
    because = getattr(instance, _PENDING, None)
    if because is not None:
        setattr(instance, _PENDING, None)
        do_revoke_user_api_tokens(instance, because, actor=Actor.system("account-change"))
