"""What a reviewer does to one entry that is not a plan: being shown its redacted fields, or
downloading its raw body. Each is audited before the caller shows or sends anything."""

from __future__ import annotations

from django.db import transaction

from audit.actions import Actor, record
from dlq.models import DeadLetter


@transaction.atomic
def do_reveal_entry(entry: DeadLetter, actor: Actor, reason: str) -> None:
    """Record that ``actor`` was shown the redacted fields of ``entry`` (the caller checked
    the permission and shows them only after this committed)."""
    record(
        "dlq.reveal",
        actor=actor,
        target=entry,
        target_type="dlq.deadletter",
        channel_slug=entry.channel.slug,
        reason=reason,
        after={
            "headers": list(entry.channel.redact_headers or []),
            "json_paths": list(entry.channel.redact_json_paths or []),
        },
    )


@transaction.atomic
def do_record_download(entry: DeadLetter, actor: Actor) -> None:
    """Record a raw-body download of an entry on a channel with redaction rules (the caller
    checked the reveal permission; the bytes are sent only after this committed)."""
    record(
        "dlq.download",
        actor=actor,
        target=entry,
        target_type="dlq.deadletter",
        channel_slug=entry.channel.slug,
        reason="raw body download",
    )
