"""The log's tree heads for witnesses (RFC 9162 §4.3–4.4, C2SP tlog-witness in spirit):

* ``GET /api/audit/checkpoints/latest/``: the newest signed checkpoint, as its file holds it.
* ``GET /api/audit/consistency/?first=N&second=M``: RFC 9162's consistency proof between the
  trees of ``N`` and ``M`` events (tree sizes, as ``get-sth-consistency``), from the stored
  complete subtrees (``audit.tree``): O(log n), however long the log.
* ``POST /api/audit/cosignatures/``: a witness's cosignature of a checkpoint it checked,
  shown on the audit page (``audit/witness.py --cosign-key``).

For the compliance role or an ``audit_witness`` token; a refusal is audited.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.urls import path
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from audit import tree
from audit.access import require_witness_access
from audit.actions import do_record_cosignature
from audit.checkpoints import checkpoint_dir, latest
from audit.models import AuditHead

COSIGNATURE_FORMAT = "cosignature/v1"


def checkpoint_note(body: dict[str, Any]) -> str:
    """The checkpoint as C2SP tlog-checkpoint text (origin, size, base64 root), which a
    witness's cosignature covers: ``dlo-audit/<key id>\\n<tree size>\\n<root>\\n``."""
    root = base64.b64encode(bytes.fromhex(str(body["root_hash"]))).decode("ascii")
    return f"dlo-audit/{body['key_id']}\n{int(body['tree_size'])}\n{root}\n"


def cosigned_message(body: dict[str, Any], timestamp: int) -> bytes:
    """What a witness signs (C2SP tlog-cosignature/v1)."""
    return f"{COSIGNATURE_FORMAT}\ntime {timestamp}\n{checkpoint_note(body)}".encode()


class LogError(serializers.Serializer[Any]):
    error = serializers.CharField()


NO_CHECKPOINT = OpenApiResponse(LogError, description="No signed checkpoint written yet.")
TREE_CONFLICT = OpenApiResponse(
    LogError, description="The stored tree cannot answer, or the root differs (tampering)."
)


class CheckpointBody(serializers.Serializer[Any]):
    format = serializers.CharField()
    number = serializers.IntegerField()
    tree_size = serializers.IntegerField()
    root_hash = serializers.CharField(help_text="RFC 9162 Merkle tree hash, hex.")
    head_hash = serializers.CharField()
    time = serializers.CharField()
    prev_checkpoint = serializers.CharField()
    key_id = serializers.CharField()


class SignedCheckpoint(serializers.Serializer[Any]):
    checkpoint = CheckpointBody()
    signature = serializers.CharField(help_text="Ed25519 over the canonical JSON, base64.")


class ConsistencyParams(serializers.Serializer[Any]):
    first = serializers.IntegerField(min_value=0, help_text="The older tree size.")
    second = serializers.IntegerField(min_value=0, help_text="The newer tree size.")


class ConsistencyProof(serializers.Serializer[Any]):
    first = serializers.IntegerField()
    second = serializers.IntegerField()
    proof = serializers.ListField(child=serializers.CharField(), help_text="Hex hashes.")


class CosignatureIn(serializers.Serializer[Any]):
    witness = serializers.CharField(max_length=100)
    public_key = serializers.CharField(max_length=64, help_text="Raw Ed25519 key, base64.")
    checkpoint_number = serializers.IntegerField(min_value=1)
    tree_size = serializers.IntegerField(min_value=1)
    root_hash = serializers.RegexField(r"^[0-9a-f]{64}$")
    key_id = serializers.RegexField(r"^[0-9a-f]{16}$", help_text="The log's key id.")
    timestamp = serializers.IntegerField(
        min_value=0, max_value=253402300799, help_text="Unix seconds."
    )
    signature = serializers.CharField(max_length=128, help_text="Ed25519, base64.")


class CosignatureOut(serializers.Serializer[Any]):
    witness = serializers.CharField()
    witness_key_id = serializers.CharField(help_text="SHA-256 of the witness key, 16 hex.")
    checkpoint_number = serializers.IntegerField()
    tree_size = serializers.IntegerField()


def _latest() -> dict[str, Any] | None:
    directory = checkpoint_dir()
    if directory is None or not directory.is_dir():
        return None
    head = AuditHead.objects.filter(pk=1).first()
    found = latest(directory, head.checkpoint_number if head else 0)
    if found is None or found.body.get("unreadable"):
        return None
    return {"checkpoint": found.body, "signature": found.signature}


@extend_schema(
    operation_id="audit_checkpoint_latest",
    responses={200: SignedCheckpoint, 404: NO_CHECKPOINT},
)
@api_view(["GET"])
def checkpoint_latest(request: Request) -> Response:
    """The newest signed checkpoint (a tree head over the sealed events)."""
    require_witness_access(request._request)
    found = _latest()
    if found is None:
        return Response({"error": "no signed checkpoint has been written"}, status=404)
    return Response(found)


@extend_schema(
    operation_id="audit_consistency",
    parameters=[ConsistencyParams],
    responses={200: ConsistencyProof, 409: TREE_CONFLICT},
)
@api_view(["GET"])
def consistency(request: Request) -> Response:
    """RFC 9162 consistency proof between two tree sizes of the log (0 < first ≤ second ≤
    the tree size of the newest checkpoint)."""
    require_witness_access(request._request)
    params = ConsistencyParams(data=request.query_params)
    params.is_valid(raise_exception=True)
    first, second = params.validated_data["first"], params.validated_data["second"]
    stored = tree.stored_size()
    if first > second or second > stored:
        raise serializers.ValidationError(
            {"second": [f"need first <= second <= {stored} (the checkpointed tree size)"]}
        )
    try:
        proof = tree.consistency_proof(first, second)
    except tree.TreeError as exc:
        return Response({"error": str(exc)}, status=409)
    return Response({"first": first, "second": second, "proof": [h.hex() for h in proof]})


@extend_schema(
    operation_id="audit_cosignature_create",
    request=CosignatureIn,
    responses={201: CosignatureOut, 409: TREE_CONFLICT},
)
@api_view(["POST"])
def cosignature(request: Request) -> Response:
    """A witness's cosignature of a checkpoint: checked against the stored tree (the root at
    that size) and against the witness's own key, then kept (one row per witness key and
    checkpoint, its time moved on at each poll)."""
    require_witness_access(request._request)
    data = CosignatureIn(data=request.data)
    data.is_valid(raise_exception=True)
    fields = data.validated_data
    size = fields["tree_size"]
    if size > tree.stored_size():
        raise serializers.ValidationError({"tree_size": ["beyond the checkpointed tree"]})
    try:
        root = tree.root_at(size).hex()
    except tree.TreeError as exc:
        return Response({"error": str(exc)}, status=409)
    if root != fields["root_hash"]:
        return Response({"error": f"the log's root at {size} events differs"}, status=409)
    try:
        raw = base64.b64decode(fields["public_key"], validate=True)
        key = Ed25519PublicKey.from_public_bytes(raw)
        body = {"key_id": fields["key_id"], "tree_size": size, "root_hash": root}
        key.verify(
            base64.b64decode(fields["signature"], validate=True),
            cosigned_message(body, fields["timestamp"]),
        )
    except (ValueError, InvalidSignature):
        raise serializers.ValidationError(
            {"signature": ["does not verify with public_key"]}
        ) from None
    saved = do_record_cosignature(
        {
            "witness": fields["witness"],
            "key_id": hashlib.sha256(raw).hexdigest()[:16],
            "checkpoint_number": fields["checkpoint_number"],
            "tree_size": size,
            "root_hash": root,
            "witnessed_at": dt.datetime.fromtimestamp(fields["timestamp"], dt.UTC),
            "signature": fields["signature"],
        }
    )
    out = {"witness": saved.witness, "witness_key_id": saved.key_id,
           "checkpoint_number": saved.checkpoint_number, "tree_size": size}  # fmt: skip
    return Response(out, status=201)


urlpatterns = [
    path("checkpoints/latest/", checkpoint_latest, name="api_audit_checkpoint_latest"),
    path("consistency/", consistency, name="api_audit_consistency"),
    path("cosignatures/", cosignature, name="api_audit_cosignatures"),
]
