"""The JSON API's plumbing on Django REST framework: bearer-token authentication, the error
shape, and the OpenAPI schema's shared error responses.

* ``Authorization: Bearer <token>`` (``manage.py apitoken``) authenticates scripts; a request
  that sends the header is judged by it alone, so a bad token is a 401 even with a session.
* A session authenticates the browser, and DRF's ``SessionAuthentication`` then enforces CSRF
  on every unsafe method (issue 12, item 3): a cross-site form cannot act as the signed-in user.
* Every error is ``{"error": "<message>"}`` (plus ``"fields"`` for a 400 naming the bad
  parameters); the access helpers' ``PermissionDenied`` / ``Http404`` become 403 / 404.

The views live with their apps (``dlq.triage.api``, ``dlq.plans.plan_api``, ``audit.api``); the
settings name these classes by dotted path, so the lower apps never import this module.
"""

from __future__ import annotations

import codecs
import io
import re
from typing import IO, Any

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response

from dashboard.models import ApiToken, hash_token

UNAUTHENTICATED = "authentication required: send Authorization: Bearer <token>"
BAD_TOKEN = "invalid or revoked token"


def user_for_authorization(header: str) -> Any | None:
    """The active user of a ``Bearer`` header's unrevoked, unexpired token (its last use
    noted), or None."""
    if not header.startswith("Bearer "):
        return None
    now = timezone.now()
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_token(header[7:].strip()), revoked=False, expires_at__gt=now)
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


def authenticate_token(request: HttpRequest) -> bool:
    """For plain Django views (``/metrics``): set ``request.user`` from the bearer token."""
    user = user_for_authorization(request.headers.get("Authorization", ""))
    if user is None:
        return False
    request.user = user
    return True


def api_error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


@csrf_exempt  # it writes nothing, and a 404 is what any method on an unknown path should get
@login_not_required
def api_not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any other ``/api/…/`` path: a JSON 404 rather than the HTML page."""
    return api_error(404, "no such API endpoint")


class BearerTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer <token>``. Any ``Authorization`` header is taken as an attempt:
    if it does not name a valid token the answer is 401, never a fall-back to the session."""

    def authenticate(self, request: Request) -> tuple[Any, None] | None:
        header = request.META.get("HTTP_AUTHORIZATION")
        if header is None:
            return None
        user = user_for_authorization(header)
        if user is None:
            raise exceptions.AuthenticationFailed(BAD_TOKEN)
        return user, None

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer a missing login with 401 (not 403), as the API always has.
        return 'Bearer realm="api"'


# No request body of this API nests deeper than 3; the C decoder recurses per level and a body
# of 1,000 "[" ended in RecursionError (an HTML 500), so depth is bounded before it parses.
MAX_JSON_DEPTH = 32
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_JSON_NESTING = re.compile(r"[\[\]{}]")


def json_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``text`` opens more than ``limit`` arrays/objects inside each other (brackets
    inside strings do not count). Linear in the text; no recursion."""
    depth = 0
    for match in _JSON_NESTING.finditer(_JSON_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser for every endpoint, refusing a body nested deeper than
    ``MAX_JSON_DEPTH`` with a 400 (``ParseError``) before the decoder sees it."""

    def parse(
        self, stream: IO[bytes], media_type: str | None = None, parser_context: Any = None
    ) -> Any:
        raw = stream.read() if stream is not None else b""
        encoding = (parser_context or {}).get("encoding") or "utf-8"
        try:
            text = codecs.decode(raw, encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        if json_too_deep(text):
            raise exceptions.ParseError(
                f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels"
            )
        return super().parse(io.BytesIO(raw), media_type, parser_context)


def _message(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(_message(item) for item in detail)
    if isinstance(detail, dict):
        return "; ".join(f"{key}: {_message(value)}" for key, value in detail.items())
    return str(detail)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler (which maps Django's PermissionDenied/Http404 too), reshaped to
    ``{"error": …}``; a validation error also lists its ``fields``."""
    # Imported here: the settings name this module, and rest_framework.views reads them.
    from rest_framework.views import exception_handler

    if isinstance(exc, exceptions.NotAuthenticated):
        exc = exceptions.NotAuthenticated(UNAUTHENTICATED)
    response = exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data
    if isinstance(exc, exceptions.ValidationError) and isinstance(detail, dict):
        fields = {key: [str(m) for m in value] if isinstance(value, list) else [_message(value)]
                  for key, value in detail.items()}  # fmt: skip
        response.data = {"error": _message(detail), "fields": fields}
    elif isinstance(detail, dict) and "detail" in detail:
        response.data = {"error": str(detail["detail"])}
    else:
        response.data = {"error": _message(detail)}
    return response


# -- OpenAPI ---------------------------------------------------------------------------------


_ERRORS = {
    "400": "A parameter or the body is invalid.",
    "401": "No credentials, or an invalid, expired or revoked token.",
    "403": "The user lacks the role, or (session) the CSRF token is missing.",
    "404": "No such object.",
    "405": "Method not allowed.",
    "406": "Only application/json is offered.",
    "415": "The body must be application/json.",
}
_BODY_ONLY = {"415"}
_PATH_ONLY = {"404"}


def add_error_responses(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular post-processing hook: every operation documents the error answers the
    framework can give it, all with the one ``Error`` shape; and every query parameter may be
    sent empty (``?since=``), which means "not set", as on the pages' forms."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault(
        "Error",
        {
            "type": "object",
            "properties": {
                "error": {"type": "string"},
                "fields": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                },
            },
            "required": ["error"],
        },
    )
    ref = {"$ref": "#/components/schemas/Error"}
    for path, methods in result.get("paths", {}).items():
        for operation in methods.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "query":
                    parameter["allowEmptyValue"] = True
            responses = operation.setdefault("responses", {})
            for status, text in _ERRORS.items():
                if status in _BODY_ONLY and "requestBody" not in operation:
                    continue
                if status in _PATH_ONLY and "{" not in path:
                    continue
                responses.setdefault(
                    status,
                    {"description": text, "content": {"application/json": {"schema": ref}}},
                )
    return result


NO_NUL = "^[^\\u0000]*$"


def _forbid_nul(schema: Any, seen: set[int]) -> None:
    if not isinstance(schema, dict) or id(schema) in seen:
        return
    seen.add(id(schema))
    if schema.get("type") == "string" and not {"enum", "format", "pattern"} & set(schema):
        schema["pattern"] = NO_NUL
    for key in ("properties",):
        for child in (schema.get(key) or {}).values():
            _forbid_nul(child, seen)
    for key in ("items", "additionalProperties"):
        _forbid_nul(schema.get(key), seen)
    for key in ("oneOf", "anyOf", "allOf"):
        for child in schema.get(key) or []:
            _forbid_nul(child, seen)


def refuse_nul_in_request_strings(
    result: dict[str, Any], generator: Any, **kwargs: Any
) -> dict[str, Any]:
    """drf-spectacular post-processing hook: every free text a request sends (query
    parameters, request bodies) says it holds no NUL, as the server has always refused one
    with a 400 (PostgreSQL text cannot store it). Responses are left as they are."""
    seen: set[int] = set()
    schemas = result.get("components", {}).get("schemas", {})
    for methods in result.get("paths", {}).values():
        for operation in methods.values():
            for parameter in operation.get("parameters", []):
                _forbid_nul(parameter.get("schema"), seen)
            body = operation.get("requestBody", {}).get("content", {})
            for media in body.values():
                schema = media.get("schema", {})
                ref = schema.get("$ref", "")
                _forbid_nul(schemas.get(ref.rsplit("/", 1)[-1]) if ref else schema, seen)
    return result
