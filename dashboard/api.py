"""Token authentication for the JSON API and ``/metrics``.

``@api_view`` marks a view as reachable without a session (it is exempt from the login redirect
and from CSRF, since it never uses cookies), authenticates ``Authorization: Bearer <token>``
(a session also works, for the browser), and answers 401 JSON instead of redirecting, and
``PermissionDenied`` / ``Http404`` from the shared access helpers as 403 / 404 JSON.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from dashboard.models import ApiToken, hash_token

View = Callable[..., HttpResponse]


def authenticate_token(request: HttpRequest) -> bool:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return False
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_token(header[7:].strip()), revoked=False)
        .first()
    )
    if token is None or not token.user.is_active:
        return False
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    request.user = token.user
    return True


def api_error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def api_view(view: View) -> View:
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if "Authorization" in request.headers:
            if not authenticate_token(request):
                return api_error(401, "invalid or revoked token")
        elif not request.user.is_authenticated:
            return api_error(401, "authentication required: send Authorization: Bearer <token>")
        # The access helpers the pages use raise these; an API answers them as JSON.
        try:
            return view(request, *args, **kwargs)
        except PermissionDenied as exc:
            return api_error(403, str(exc) or "permission denied")
        except Http404 as exc:
            return api_error(404, str(exc) or "not found")

    return login_not_required(csrf_exempt(wrapper))
