"""``described``: a stored finding with its principle's name and why (see ``principles.py``)."""

from __future__ import annotations

from typing import Any

from django import template

from channels_registry.principles import describe

register = template.Library()


@register.filter
def described(finding: dict[str, Any]) -> dict[str, Any]:
    return describe(finding)
