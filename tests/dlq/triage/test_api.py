from __future__ import annotations

import base64
import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.models import ApiToken
from tests.conftest import make_channel
from tests.dlq.conftest import letter, store

pytestmark = pytest.mark.django_db


def bearer(user: User) -> dict[str, str]:
    _, raw = ApiToken.issue(user, "test")
    return {"Authorization": f"Bearer {raw}"}


def test_api_needs_a_token_and_the_viewer_role(outsider: User) -> None:
    assert Client().get("/api/dead-letters/").status_code == 401
    bad = {"Authorization": "Bearer nope"}
    assert Client().get("/api/dead-letters/", headers=bad).status_code == 401
    response = Client().get("/api/dead-letters/", headers=bearer(outsider))
    assert response.status_code == 403 and "error" in response.json()


def test_api_filters_and_follows_the_cursor(viewer: User) -> None:
    channel = make_channel(redact_json_paths=[], redact_headers=[])
    other = make_channel(slug="billing", address="billing", dlq_address="billing.dlq")
    bodies = [b'{"n": %d}' % i for i in range(7)]
    store(channel, *[letter(b) for b in bodies])
    store(other, letter(b'{"other": 1}'))
    client, headers = Client(), bearer(viewer)
    url: str | None = "/api/dead-letters/?channel=orders&limit=3"
    seen: list[bytes] = []
    pages = 0
    while url:
        data = client.get(url, headers=headers).json()
        seen += [base64.b64decode(r["body_base64"]) for r in data["results"]]
        assert all(r["channel"] == "orders" for r in data["results"])
        url = data["next"]
        pages += 1
        assert pages < 10
    assert pages == 3 and seen == list(reversed(bodies))
    assert client.get("/api/dead-letters/?after=x", headers=headers).status_code == 400


def test_api_redacts_per_channel_rules_even_for_reveal_users(compliance: User) -> None:
    channel = make_channel(redact_json_paths=["$.card"], redact_headers=["Authorization"])
    # A card number no timestamp or hash in the answer can contain by chance ("4111" alone
    # once matched the microseconds of ingested_at).
    card = b"4111-1111-CARD"
    store(channel, letter(b'{"card": "%s", "amount": 5}' % card, headers={"Authorization": "B x"}))
    store(channel, letter(b"card=%s not json" % card))
    data = Client().get("/api/dead-letters/", headers=bearer(compliance)).json()
    text = json.dumps(data)
    assert card.decode() not in text and "B x" not in text
    hidden, redacted = data["results"]
    assert hidden["body_base64"] is None and hidden["text_preview"] is None
    body = json.loads(base64.b64decode(redacted["body_base64"]))
    assert body == {"card": "•••• redacted", "amount": 5}
    assert redacted["headers"]["Authorization"] == "•••• redacted"
    assert redacted["redacted"] is True


def test_api_refuses_a_cursor_of_non_ascii_digits(viewer: User) -> None:
    headers = bearer(viewer)
    for url in ["/api/dead-letters/?after=²", "/api/replay-plans/?after=²"]:
        response = Client().get(url, headers=headers)
        assert response.status_code == 400, url
        assert "after must be" in response.json()["error"]


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_json_nested_a_thousand_deep_is_a_400_not_a_500(viewer: User, opening: str) -> None:
    """Issue #27 item 5: a viewer's token and 1,000 levels of nesting gave an HTML 500
    (RecursionError); the parser bounds depth for every endpoint."""
    closing = "]" if opening == "[" else "}"
    body = opening * 1000 + "1" + closing * 1000
    response = Client().post(
        "/api/replay-plans/", body, content_type="application/json", headers=bearer(viewer)
    )
    assert response.status_code == 400
    assert "nested deeper" in response.json()["error"]


def test_brackets_inside_strings_do_not_count_as_nesting(oncall: User) -> None:
    body = json.dumps({"kind": "replay", "reason": "[" * 5000 + '\\"{' * 100, "ids": [1]})
    response = Client().post(
        "/api/replay-plans/", body, content_type="application/json", headers=bearer(oncall)
    )
    assert response.status_code != 500
    assert "nested deeper" not in response.content.decode()
