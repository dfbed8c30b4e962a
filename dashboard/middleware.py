"""Security headers on every response (Django 5.2 has no built-in CSP), and the refusal of
request parameters no page can store or search for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest


class SecurityHeadersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", settings.CONTENT_SECURITY_POLICY)
        response.headers.setdefault(
            "Permissions-Policy", "camera=(), microphone=(), geolocation=()"
        )
        response.headers.setdefault("Cross-Origin-Resource-Policy", "same-origin")
        return response


NUL_REFUSAL = "Request parameters may not contain NUL characters."
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
API_PREFIX = "/api/"


def _has_nul(data: Any) -> bool:
    return any("\x00" in key or any("\x00" in v for v in values) for key, values in data.lists())


class RejectNulMiddleware:
    """400 for a NUL character in any query parameter or form field (name or value).

    PostgreSQL text cannot hold NUL, so a filter or form carrying one would fail inside the
    query as a 500; no field of this product means anything by it. Form bodies are parsed
    here as CsrfViewMiddleware would parse them anyway (file contents are not inspected).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIX):
            # The API's serializers refuse NUL per field, in the API's own error format.
            return self.get_response(request)
        form_body = request.content_type in FORM_TYPES
        if _has_nul(request.GET) or (
            form_body and request.method == "POST" and _has_nul(request.POST)
        ):
            return HttpResponseBadRequest(NUL_REFUSAL, content_type="text/plain; charset=utf-8")
        return self.get_response(request)
