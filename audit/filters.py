"""The filters shared by the audit page, its exports, the API and ``audit export``.

Pagination is a keyset on ``seq``, newest first: a page is ``seq < before`` ordered by ``-seq``,
so a deep page costs what the first one does (no COUNT, no OFFSET).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.db.models import Q, QuerySet

from audit.models import AuditEvent, Outcome

PAGE_SIZE = 50
API_PAGE_SIZE = 100
API_MAX_PAGE_SIZE = 500

# The filter names, in the order they appear in URLs and in the audit record of an export.
FILTER_NAMES = (
    "actor",
    "action",
    "target_type",
    "target_id",
    "channel",
    "outcome",
    "plan",
    "since",
    "until",
)

# Each filter but ``action`` (exact or prefix) and its lookup on ``AuditEvent``.
_LOOKUPS = {
    "actor": "actor_username",
    "target_type": "target_type",
    "target_id": "target_id",
    "channel": "channel_slug",
    "outcome": "outcome",
    "plan": "plan_id",
    "since": "created_at__gte",
    "until": "created_at__lt",
}


#: Finders of events that record something about a target without naming it as theirs: a
#: relay batch's record (target: the plan) lists each entry's outcome. ``finder(target_type,
#: target_id)`` returns those events' ids (bounded); registered by the apps that write them
#: (``DlqConfig.ready``), so this layer imports none of them.
_RELATED: list[Callable[[str, str], list[int]]] = []


def register_related(finder: Callable[[str, str], list[int]]) -> None:
    if finder not in _RELATED:
        _RELATED.append(finder)


class AuditFilterForm(forms.Form):
    """Validates the filters from a query string (or the ``audit export`` options).

    ``action`` matches exactly, or as a prefix when it ends with ``*`` (``dlq.*``). ``since`` is
    inclusive and ``until`` exclusive; a date or time without an offset is UTC.
    """

    actor = forms.CharField(max_length=150, required=False, label="Actor")
    action = forms.CharField(max_length=64, required=False, label="Action")
    target_type = forms.CharField(max_length=64, required=False, label="Target type")
    target_id = forms.CharField(max_length=64, required=False, label="Target id")
    channel = forms.CharField(max_length=100, required=False, label="Channel")
    outcome = forms.ChoiceField(
        choices=[("", "Any outcome"), *Outcome.choices], required=False, label="Outcome"
    )
    plan = forms.CharField(max_length=64, required=False, label="Plan")
    since = forms.DateTimeField(required=False, label="From")
    until = forms.DateTimeField(required=False, label="Until")
    before = forms.IntegerField(min_value=1, required=False, label="Older than seq")

    def __init__(self, *args: Any, empty_range_ok: bool = False, **kwargs: Any) -> None:
        """``empty_range_ok``: ``since`` at or after ``until`` is an empty range, not an error
        (the API: its schema cannot say one bound must precede the other). The page and the
        export refuse ``since`` after ``until`` as a likely slip; ``since == until`` is valid
        everywhere (the empty half-open range)."""
        super().__init__(*args, **kwargs)
        self.empty_range_ok = empty_range_ok

    def _clean_bound(self, name: str) -> dt.datetime | None:
        """A time that exists in UTC too (``9999-12-31T23:00-05:00`` does not, and would fail
        in the query rather than here)."""
        value: dt.datetime | None = self.cleaned_data.get(name)
        try:
            return value.astimezone(dt.UTC) if value else value
        except OverflowError:
            raise forms.ValidationError("That time is out of range.") from None

    def clean_since(self) -> dt.datetime | None:
        return self._clean_bound("since")

    def clean_until(self) -> dt.datetime | None:
        return self._clean_bound("until")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until and not self.empty_range_ok:
            raise forms.ValidationError("“From” must not be later than “Until”.")
        return cleaned

    def apply(self, events: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
        """``events`` narrowed by the valid filters (not by the ``before`` cursor). A target
        filter also matches the events that record something about that target under another
        one (``register_related``: a relay batch's record for each entry it lists)."""
        data = self.cleaned_data
        lookups = {lookup: data[name] for name, lookup in _LOOKUPS.items() if data.get(name)}
        action = data.get("action") or ""
        if action.endswith("*"):
            lookups["action__startswith"] = action[:-1]
        elif action:
            lookups["action"] = action
        target_id = lookups.pop("target_id", "")
        if not target_id:
            return events.filter(**lookups)
        target_type = lookups.pop("target_type", "")
        target = Q(target_id=target_id) & (Q(target_type=target_type) if target_type else Q())
        related = [pk for finder in _RELATED for pk in finder(target_type, target_id)]
        if related:
            target |= Q(pk__in=related)
        return events.filter(target, **lookups)

    @property
    def cursor(self) -> int | None:
        return self.cleaned_data.get("before")

    def active(self) -> dict[str, str]:
        """The filters in use, as text (times in ISO 8601 UTC): for links and the audit record."""
        active: dict[str, str] = {}
        for name in FILTER_NAMES:
            value = self.cleaned_data.get(name)
            if isinstance(value, dt.datetime):
                active[name] = value.astimezone(dt.UTC).isoformat()
            elif value:
                active[name] = str(value)
        return active

    def is_contiguous(self) -> bool:
        """True when only time bounds are set: the matching events are a run of consecutive
        seqs, so an export of them can be verified link by link, not only event by event."""
        return not (set(self.active()) - {"since", "until"})

    def querystring(self, **extra: Any) -> str:
        """The raw filter values as typed (so the form shows them back), plus ``extra``."""
        params = {name: self.data[name] for name in FILTER_NAMES if self.data.get(name)}
        params.update({key: value for key, value in extra.items() if value is not None})
        return urlencode(params)


def page_of(
    events: QuerySet[AuditEvent], before: int | None, size: int = PAGE_SIZE
) -> tuple[list[AuditEvent], int | None]:
    """One page, newest first, and the cursor of the next (older) page or ``None``.

    Fetches ``size + 1`` rows: the extra one only says whether an older page exists.
    """
    if before is not None:
        events = events.filter(seq__lt=before)
    rows = list(events.order_by("-seq")[: size + 1])
    next_before = rows[size - 1].seq if len(rows) > size else None
    return rows[:size], next_before
