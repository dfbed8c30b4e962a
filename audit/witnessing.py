"""The database side of witnessing: ``audit verify --witness STATE`` (the log must extend the
last head a witness saw) and the audit page's "last witnessed" line."""

from __future__ import annotations

import base64
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit import witness
from audit.checkpoints import Checkpoint
from audit.models import AuditCosignature


class WitnessStateError(ValueError):
    """The state file cannot be used (missing, empty, not signed by a trusted key)."""


def witnessed_head(path: str | Path, keys: dict[str, Ed25519PublicKey]) -> Checkpoint:
    """The last head in a witness's state file, its signature checked with ``keys``."""
    try:
        head = witness.last_head(path)
    except witness.CannotCheck as exc:
        raise WitnessStateError(str(exc)) from None
    if head is None:
        raise WitnessStateError(f"{path}: no witnessed head (run audit/witness.py first)")
    cp = Checkpoint(head["checkpoint"], str(head.get("signature", "")), Path(path))
    key = keys.get(str(cp.body.get("key_id")))
    try:
        if key is None:
            raise InvalidSignature
        key.verify(base64.b64decode(cp.signature), cp.signed_bytes())
    except (InvalidSignature, ValueError):
        raise WitnessStateError(
            f"{path}: the witnessed checkpoint #{cp.number} is not signed by a trusted key"
        ) from None
    return cp


def compare_witnessed(cp: Checkpoint, at_size: tuple[str, str] | None, events: int) -> str:
    """'' when the walked log extends the witnessed head, else what is wrong."""
    if at_size is None:
        return (
            f"the witness saw checkpoint #{cp.number} of {cp.tree_size} events but the "
            f"database ends at #{events}: events #{events + 1}–#{cp.tree_size} were cut"
        )
    if at_size[0] != cp.body.get("root_hash"):
        return (
            f"the database does not extend the head the witness saw (checkpoint #{cp.number}, "
            f"{cp.tree_size} events): its first {cp.tree_size} events hash to another Merkle "
            "root, so history was rewritten (even if re-signed with the real key)"
        )
    return ""


def latest_cosignature() -> AuditCosignature | None:
    """The newest witness cosignature (one indexed row), for the audit page."""
    return AuditCosignature.objects.order_by("-witnessed_at").first()
