"""``visible``: broker-supplied text with control and direction-changing characters shown as
markers, so a right-to-left override cannot reorder what a reviewer reads. Escaping is still
Django's (the result is a plain, unsafe string). The project's engine already applies it to
every variable (``dashboard.templating``); the filter stays for templates rendered elsewhere."""

from __future__ import annotations

from typing import Any

from django import template

from dashboard.text import visible as visible_text

register = template.Library()


@register.filter
def visible(value: Any) -> str:
    return visible_text("" if value is None else str(value))
