"""The admin's list columns through ``visible``, as every template variable is
(``dashboard.templating``): the admin builds its change-list cells and read-only values in
Python (``format_html``), outside the engine's variable nodes, so its text columns need this."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.http import HttpRequest

from dashboard.text import visible

_TEXT_FIELDS = (models.CharField, models.TextField, models.ForeignKey)


def visible_value(value: Any) -> str:
    """``value`` as display text with invisible and control characters marked; "" for None."""
    return "" if value is None else visible(str(value))


class _Shown:
    """An object's stand-in for the admin's action checkbox: its pk, its text made visible."""

    def __init__(self, obj: Any) -> None:
        self.pk = obj.pk
        self._text = visible_value(obj)

    def __str__(self) -> str:
        return self._text


class VisibleTextAdmin(admin.ModelAdmin):
    """A ``ModelAdmin`` whose ``list_display`` text fields (and ``__str__``) print through
    ``visible``; fields with choices keep their labels, numbers and dates are left alone. The
    action checkbox's label (the object's text, rendered by a form widget) too."""

    def action_checkbox(self, obj: Any) -> Any:
        return super().action_checkbox(_Shown(obj))

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        return [self._visible_column(name) for name in super().get_list_display(request)]

    def _visible_column(self, name: Any) -> Any:
        if not isinstance(name, str):
            return name
        cache: dict[str, Callable[[Any], str]] = self.__dict__.setdefault("_visible_columns", {})
        if name not in cache:
            column = self._make_column(name)
            if column is None:
                return name
            cache[name] = column
        return cache[name]

    def _make_column(self, name: str) -> Callable[[Any], str] | None:
        if name == "__str__":
            label, order = self.model._meta.verbose_name, None
        else:
            try:
                field = self.model._meta.get_field(name)
            except FieldDoesNotExist:
                return None  # an admin method: its author decides
            if not isinstance(field, _TEXT_FIELDS) or getattr(field, "choices", None):
                return None
            label, order = field.verbose_name, name

        def column(obj: Any) -> str:
            return visible_value(obj if name == "__str__" else getattr(obj, name))

        column.short_description = label  # type: ignore[attr-defined]
        if order:
            column.admin_order_field = order  # type: ignore[attr-defined]
        column.__name__ = name
        return column
