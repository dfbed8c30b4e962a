"""The project's template backend: Django's, except that every ``{{ variable }}`` it prints in
an autoescaped template goes through ``dashboard.text.visible`` before escaping, so invisible,
control and direction-changing characters in user- or message-controlled text show as markers
on every page (the Django admin's included) without a filter anyone must remember.

1. ``DjangoTemplates`` builds a ``VisibleEngine`` instead of Django's ``Engine``.
2. Every template the engine hands out (found by a loader, included, extended, a
   ``{% partialdef %}`` fragment, or compiled from a string) has its variable nodes switched
   once to ``VisibleVariableNode``; a flag on the template makes that a no-op afterwards.
3. ``VisibleVariableNode`` renders as Django's ``VariableNode`` does, with ``visible`` applied
   to plain (not safe) strings when autoescaping is on. Safe strings are HTML the code built,
   whose builders apply ``visible`` themselves (``dashboard.html.escape`` does).

Form widgets are rendered by the form renderer's own engine and keep their values as they are:
a field edited and saved must not gain markers. Django has no hook for this, hence the node
class switch; it relies only on ``VariableNode``'s documented-by-use fields
(``filter_expression``) and on ``Node.get_nodes_by_type``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.conf import settings
from django.template import Engine
from django.template.backends.base import BaseEngine
from django.template.backends.django import DjangoTemplates as BaseDjangoTemplates
from django.template.base import Template, VariableNode
from django.utils.formats import localize
from django.utils.html import conditional_escape, escape
from django.utils.safestring import SafeData
from django.utils.timezone import template_localtime  # type: ignore[attr-defined]

from dashboard.text import visible

_FLAG = "_dlo_visible_text"


class VisibleVariableNode(VariableNode):
    def render(self, context: Any) -> str:
        try:
            output = self.filter_expression.resolve(context)
        except UnicodeDecodeError:
            return ""  # as Django's VariableNode
        value = template_localtime(output, use_tz=context.use_tz)
        value = localize(value, use_l10n=context.use_l10n)
        if not context.autoescape:
            return str(value)
        if not issubclass(type(value), str):
            value = str(value)
        if isinstance(value, SafeData) or hasattr(value, "__html__"):
            return conditional_escape(value)
        return escape(visible(value))


def mark_visible(template: Any) -> Any:
    """Switch ``template``'s variable nodes to ``VisibleVariableNode`` (once); returns it."""
    if getattr(template, _FLAG, False):
        return template
    nodelist = getattr(template, "nodelist", None)
    if nodelist is not None:
        for node in nodelist.get_nodes_by_type(VariableNode):
            if type(node) is VariableNode:
                node.__class__ = VisibleVariableNode
    # An object without a __dict__ is simply walked again next time.
    with contextlib.suppress(AttributeError):
        setattr(template, _FLAG, True)
    return template


class VisibleEngine(Engine):
    def find_template(self, name: str, dirs: Any = None, skip: Any = None) -> tuple[Template, Any]:
        template, origin = super().find_template(name, dirs, skip)
        return mark_visible(template), origin

    def from_string(self, template_code: str) -> Template:
        return mark_visible(super().from_string(template_code))


class DjangoTemplates(BaseDjangoTemplates):
    """``django.template.backends.django.DjangoTemplates`` building a ``VisibleEngine`` (its
    ``__init__`` with the engine class changed)."""

    def __init__(self, params: dict[str, Any]) -> None:
        params = params.copy()
        options = params.pop("OPTIONS").copy()
        options.setdefault("autoescape", True)
        options.setdefault("debug", settings.DEBUG)
        options.setdefault("file_charset", "utf-8")
        options["libraries"] = self.get_templatetag_libraries(options.get("libraries", {}))
        BaseEngine.__init__(self, params)
        self.engine = VisibleEngine(self.dirs, self.app_dirs, **options)
