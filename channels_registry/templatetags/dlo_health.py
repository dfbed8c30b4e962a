"""Formatting of health values: unknown (None) is shown as "unknown", never as 0."""

from __future__ import annotations

from typing import Any

from django import template

from channels_registry.health import fmt_duration

register = template.Library()


@register.filter
def num(value: Any) -> str:
    """1234567 → "1,234,567"; None → "—" (unknown)."""
    if value is None or value == "":
        return "—"
    try:
        return f"{round(float(value)):,}"
    except (TypeError, ValueError):
        return "—"


@register.filter
def duration(value: Any) -> str:
    """Seconds → "42 s", "7 min", "3.5 h"; None → "—"."""
    if value is None or value == "":
        return "—"
    return fmt_duration(float(value))
