"""Issue 15 pieces rendered on the server: local times, the theme toggle and its scripts."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User

from dashboard.templatetags.dlo_time import when
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def test_when_is_a_utc_time_element_the_browser_localises() -> None:
    at = dt.datetime(2026, 12, 1, 5, 44, 12, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    html = str(when(at, "seconds"))
    assert html == (
        '<time datetime="2026-12-01T04:44:12+00:00" data-local="seconds"'
        ' title="2026-12-01 04:44:12 UTC">2026-12-01 04:44:12 UTC</time>'
    )
    assert ">04:44 UTC<" in str(when(at, "time"))
    assert when(None) == "—"


@pytest.mark.parametrize(
    "at",
    [
        dt.datetime(2026, 12, 1, 5, 44, 12, 123456, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
        dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC).replace(tzinfo=None),  # naive: UTC
        dt.datetime(1000, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC),
        dt.datetime(999, 12, 31, 23, 59, 59, tzinfo=dt.UTC),  # strftime's unpadded year
        dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.UTC),
    ],
)
def test_when_shows_what_strftime_shows(at: dt.datetime) -> None:
    """``when`` cuts its text from ``isoformat()``: the same as ``strftime`` would write."""
    from dashboard.templatetags.dlo_time import FORMATS

    utc = at.astimezone(dt.UTC) if at.tzinfo else at.replace(tzinfo=dt.UTC)
    for style in [*FORMATS, "no-such-style"]:
        shown = utc.strftime(FORMATS.get(style, FORMATS["minutes"]))
        seconds = utc.strftime(FORMATS["seconds"])
        assert str(when(at, style)).endswith(f' title="{seconds} UTC">{shown} UTC</time>')


def test_every_page_loads_the_theme_and_time_scripts_without_inline_code(viewer: User) -> None:
    html = client_for(viewer).get("/").content.decode()
    assert 'src="/static/dlo/theme.js"' in html and 'src="/static/dlo/ui.js"' in html
    assert 'id="theme-toggle"' in html and 'href="#main"' in html
    assert "<script>" not in html and " style=" not in html
