"""Registered message schemas (P1/P9): validating a body, and checking a new version's
compatibility with the previous one.

Validation uses the ``jsonschema`` library (the draft the schema's ``$schema`` names, else
2020-12). A failure is reported by its JSON path (``$.customer.id``) and jsonschema's message.

Compatibility is checked structurally on what JSON Schema evolution usually breaks, object by
object through ``properties``:

- backward (new readers read old messages): the new version may not require a property the
  old one did not, nor change a property's type, nor close ``additionalProperties`` where the
  old one left it open;
- forward (old readers read new messages): the new version may not stop requiring a property
  the old one required, nor change a property's type, nor drop a property the old one declared
  while the old one rejects unknown properties;
- full: both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.validators import validator_for

from channels_registry.models import Channel, MessageSchema, SchemaCompatibility

MAX_DEPTH = 32


@dataclasses.dataclass(frozen=True)
class SchemaFailure:
    path: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


def json_path(error: ValidationError) -> str:
    path = "$"
    for step in error.absolute_path:
        path += f"[{step}]" if isinstance(step, int) else f".{step}"
    return path


def check_schema(schema: Any) -> str:
    """ "" when ``schema`` is a valid JSON Schema, else why not."""
    if not isinstance(schema, dict):
        return "A JSON Schema here is an object."
    try:
        validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        return f"Not a valid JSON Schema: {exc.message}"
    return ""


def validate(schema: Any, document: Any) -> SchemaFailure | None:
    """The first (most relevant) failure of ``document`` against ``schema``, or None."""
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(cls(schema).iter_errors(document))
    if error is None:
        return None
    return SchemaFailure(json_path(error), error.message[:1000])


def schema_for(channel: Channel, version: str = "") -> MessageSchema | None:
    """The registered schema selected by the channel's schema name and ``version`` (the entry's
    own, when registered) or else the channel's declared version. Cached on the instance, so a
    batch asks the database once per version."""
    if not channel.schema_name:
        return None
    cache: dict[str, MessageSchema | None] = channel.__dict__.setdefault("_schema_cache", {})
    for wanted in dict.fromkeys(v for v in (version, channel.schema_version) if v):
        if wanted not in cache:
            cache[wanted] = MessageSchema.objects.filter(
                name=channel.schema_name, version=wanted
            ).first()
        if cache[wanted] is not None:
            return cache[wanted]
    return None


def failure(
    channel: Channel, document: Any, version: str = "", *, parsed: bool = True
) -> SchemaFailure | None:
    """Why a (parsed) body fails the channel's registered schema; None when it passes or no
    schema is registered. Unparsed bodies are left to the parse check."""
    if not parsed:
        return None
    registered = schema_for(channel, version)
    if registered is None:
        return None
    return validate(registered.schema, document)


# -- compatibility of a new version ---------------------------------------------------------


def _type(node: dict[str, Any]) -> Any:
    kind = node.get("type")
    return sorted(kind) if isinstance(kind, list) else kind


def _objects(
    old: Any, new: Any, path: str, depth: int = 0
) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    if depth > MAX_DEPTH or not isinstance(old, dict) or not isinstance(new, dict):
        return
    yield path, old, new
    old_props, new_props = old.get("properties") or {}, new.get("properties") or {}
    if isinstance(old_props, dict) and isinstance(new_props, dict):
        for name in old_props.keys() & new_props.keys():
            yield from _objects(old_props[name], new_props[name], f"{path}.{name}", depth + 1)
    if isinstance(old.get("items"), dict) and isinstance(new.get("items"), dict):
        yield from _objects(old["items"], new["items"], f"{path}[]", depth + 1)


def compatibility_problems(old: Any, new: Any, mode: str) -> list[str]:
    """What makes ``new`` incompatible with ``old`` under ``mode``; empty when compatible."""
    if mode not in (SchemaCompatibility.BACKWARD, SchemaCompatibility.FORWARD, "full"):
        return []
    backward = mode in (SchemaCompatibility.BACKWARD, SchemaCompatibility.FULL)
    forward = mode in (SchemaCompatibility.FORWARD, SchemaCompatibility.FULL)
    problems: list[str] = []
    for path, o, n in _objects(old, new, "$"):
        if _type(o) != _type(n) and o.get("type") is not None:
            problems.append(f"{path}: type changed from {_type(o)} to {_type(n)}")
        old_req = set(o.get("required") or [])
        new_req = set(n.get("required") or [])
        old_props = set((o.get("properties") or {}).keys())
        new_props = set((n.get("properties") or {}).keys())
        if backward:
            for name in sorted(new_req - old_req):
                problems.append(
                    f"{path}.{name}: newly required, so messages written without it fail (backward)"
                )
            if (
                n.get("additionalProperties") is False
                and o.get("additionalProperties") is not False
            ):
                problems.append(
                    f"{path}: additionalProperties closed, so older messages with extra "
                    "properties fail (backward)"
                )
        if forward:
            for name in sorted(old_req - new_req):
                problems.append(
                    f"{path}.{name}: no longer required, so old readers that need it fail (forward)"
                )
            if o.get("additionalProperties") is False:
                for name in sorted(new_props - old_props):
                    problems.append(
                        f"{path}.{name}: new property that old readers reject "
                        "(additionalProperties false) (forward)"
                    )
    return problems


def strictest_mode(name: str) -> str:
    """The compatibility mode to enforce for schema ``name``: the strictest any channel using
    it declares (full > backward/forward; backward and forward together mean full)."""
    modes = set(
        Channel.objects.filter(schema_name=name)
        .exclude(schema_compatibility="")
        .values_list("schema_compatibility", flat=True)
    )
    if (
        SchemaCompatibility.FULL in modes
        or {
            SchemaCompatibility.BACKWARD,
            SchemaCompatibility.FORWARD,
        }
        <= modes
    ):
        return SchemaCompatibility.FULL
    return next(iter(modes), "")


def registration_problems(candidate: MessageSchema) -> list[str]:
    """Why ``candidate`` cannot be registered: not a JSON Schema, or incompatible with the
    latest other version of its name under the declared mode."""
    invalid = check_schema(candidate.schema)
    if invalid:
        return [invalid]
    previous = (
        MessageSchema.objects.filter(name=candidate.name)
        .exclude(pk=candidate.pk)
        .order_by("-created_at", "-pk")
        .first()
    )
    if previous is None:
        return []
    mode = strictest_mode(candidate.name)
    return [
        f"Incompatible with v{previous.version} under {mode} compatibility: {p}"
        for p in compatibility_problems(previous.schema, candidate.schema, mode)
    ]
