"""Alert pages: the list (with silences), one alert, acknowledge, silence, the nav badge, and
the Prometheus ``/metrics`` endpoint."""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from alerts import current, metrics
from alerts.access import (
    ACK_PERMISSION,
    EXPIRE_PERMISSION,
    SILENCE_PERMISSION,
    VIEW_PERMISSION,
    alerts_for_user,
    get_alert_for_user,
    require_alert_permission,
)
from alerts.actions import do_acknowledge_alert, do_create_silence, do_expire_silence
from alerts.evaluate import firing_count
from alerts.models import (
    ACTIVE_STATES,
    AlertState,
    DeliveryAttempt,
    Notification,
    NotificationStatus,
    RuleKey,
    Silence,
)
from audit.actions import Actor
from channels_registry.access import channels_for_user
from dashboard.api import api_error, authenticate_token
from dashboard.http import HtmxHttpRequest
from dashboard.proxy import client_address

log = logging.getLogger(__name__)

RESOLVED_SHOWN = 100
SILENCE_DURATIONS = [
    (30, "30 minutes"),
    (60, "1 hour"),
    (240, "4 hours"),
    (720, "12 hours"),
    (1440, "24 hours"),
    (10080, "7 days"),
]
# htmx stops polling an element that receives this status (an expired session, say).
STOP_POLLING = 286


def _troubles(alert_ids: list[int]) -> dict[int, tuple[int, int]]:
    """Per alert: (notifications given up on, notifications being retried)."""
    result: dict[int, tuple[int, int]] = {}
    rows = Notification.objects.filter(alert_id__in=alert_ids).filter(
        Q(status=NotificationStatus.FAILED) | Q(status=NotificationStatus.PENDING, attempts__gt=0)
    )
    for alert_id, status in rows.values_list("alert_id", "status"):
        failed, retrying = result.get(alert_id, (0, 0))
        if status == NotificationStatus.FAILED:
            failed += 1
        else:
            retrying += 1
        result[alert_id] = (failed, retrying)
    return result


@require_GET
def alert_list(request: HtmxHttpRequest) -> HttpResponse:
    alerts = alerts_for_user(request)
    show = request.GET.get("show", "active")
    if show not in ("active", "resolved"):
        show = "active"
    now = timezone.now()
    if show == "active":
        rows = list(alerts.filter(state__in=ACTIVE_STATES).order_by("-fired_at", "-id")[:1000])
        rows.sort(key=lambda a: (a.state != AlertState.FIRING, a.muted, a.severity != "critical"))
    else:
        rows = list(alerts.filter(state=AlertState.RESOLVED).order_by("-id")[:RESOLVED_SHOWN])
    troubles = _troubles([a.pk for a in rows])
    now_values = current.values_now(rows, now)
    for a in rows:
        a.values_text = current.describe(a, now_values.get(a.pk))  # type: ignore[attr-defined]
    context: dict[str, Any] = {
        "rows": [(a, *troubles.get(a.pk, (0, 0))) for a in rows],
        "show": show,
        "firing": firing_count(),
        "silences": Silence.objects.filter(ends_at__gt=now)
        .select_related("channel", "created_by")
        .order_by("ends_at"),
        "now": now,
        **_silence_form_context(request),
    }
    template = "alerts/alert_list.html"
    if request.htmx and not request.htmx.boosted:
        template += "#alerts"
    return render(request, template, context)


def _silence_form_context(request: HttpRequest) -> dict[str, Any]:
    return {
        "can_silence": request.user.has_perm(SILENCE_PERMISSION),
        "can_expire": request.user.has_perm(EXPIRE_PERMISSION),
        "rules": RuleKey.choices,
        "durations": SILENCE_DURATIONS,
        "channel_slugs": channels_for_user(request).values_list("slug", flat=True),
    }


@require_GET
def alert_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    alert = get_alert_for_user(request, pk)
    now_value = current.values_now([alert], timezone.now()).get(alert.pk)
    values_text = current.describe(alert, now_value)
    if request.htmx and not request.htmx.boosted:
        return render(
            request, "alerts/alert_detail.html#values", {"alert": alert, "values_text": values_text}
        )
    context = {
        "alert": alert,
        "values_text": values_text,
        "notifications": alert.notifications.select_related("destination").order_by("id"),
        "attempts": DeliveryAttempt.objects.filter(
            batch__in=alert.notifications.exclude(batch="").values("batch")
        ).select_related("destination")[:50],
        "can_ack": request.user.has_perm(ACK_PERMISSION) and alert.is_active,
        **_silence_form_context(request),
    }
    return render(request, "alerts/alert_detail.html", context)


@require_POST
def alert_ack(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    alert = get_alert_for_user(request, pk)
    require_alert_permission(
        request,
        ACK_PERMISSION,
        target_type="alerts.alert",
        target_repr=f"{alert} (#{alert.pk})",
        message="You need the on-call role to acknowledge alerts.",
    )
    try:
        do_acknowledge_alert(
            alert.pk, actor=Actor.from_request(request), note=request.POST.get("note", "")
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, "Acknowledged.")
    return redirect(alert.get_absolute_url())


@require_POST
def silence_create(request: HtmxHttpRequest) -> HttpResponse:
    require_alert_permission(
        request,
        SILENCE_PERMISSION,
        target_type="alerts.silence",
        target_repr=f"channel {request.POST.get('channel', '')[:100]!r}, "
        f"rule {request.POST.get('rule', '')[:100]!r}",
        message="You need the on-call role to silence alerts.",
    )
    slug = request.POST.get("channel", "").strip()
    channel = get_object_or_404(channels_for_user(request), slug=slug) if slug else None
    rule = request.POST.get("rule", "").strip()
    try:
        minutes = int(request.POST.get("minutes", "60"))
        do_create_silence(
            actor=Actor.from_request(request),
            channel=channel,
            rule=rule,
            duration=dt.timedelta(minutes=minutes),
            reason=request.POST.get("reason", "")[:2000],
        )
    except (ValueError, OverflowError, ValidationError) as exc:
        # A number too large for a timedelta is as wrong as one that is not a number.
        text = " ".join(exc.messages) if isinstance(exc, ValidationError) else "Pick a duration."
        messages.error(request, f"Not silenced: {text}")
    else:
        messages.success(request, "Silenced. It applies from the next evaluation (≤ 15 s).")
    back = request.POST.get("next", "")
    if back.startswith("/alerts/") and "//" not in back:
        return redirect(back)
    return redirect("alerts:alert_list")


@require_POST
def silence_expire(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    require_alert_permission(
        request,
        EXPIRE_PERMISSION,
        target_type="alerts.silence",
        target_repr=f"silence #{pk}",
        message="You need the on-call role to end silences.",
    )
    try:
        do_expire_silence(pk, actor=Actor.from_request(request), reason="ended early")
    except Silence.DoesNotExist:
        raise Http404("No such silence.") from None
    messages.success(request, "Silence ended.")
    return redirect("alerts:alert_list")


@require_GET
@never_cache
@login_not_required
def badge(request: HtmxHttpRequest) -> HttpResponse:
    """The nav badge, polled every 10 s by htmx. Anonymous or unauthorised: stop polling."""
    if not request.user.is_authenticated or not request.user.has_perm(VIEW_PERMISSION):
        return HttpResponse(status=STOP_POLLING)
    variant = request.GET.get("variant", "nav")
    return render(
        request,
        "alerts/_badge.html",
        {"allowed": True, "firing": firing_count(), "variant": variant},
    )


def _allowed_network(request: HttpRequest) -> bool:
    raw = client_address(request) or ""
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return False
    for network in getattr(settings, "METRICS_ALLOWED_NETWORKS", ["127.0.0.1/32", "::1/128"]):
        try:
            if address in ipaddress.ip_network(network, strict=False):
                return True
        except ValueError:
            log.warning("METRICS_ALLOWED_NETWORKS: %r is not a network", network)
    return False


@require_GET
@never_cache
@login_not_required
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape: a bearer token (``manage.py apitoken``) of a user with the viewer
    role, or a request from ``METRICS_ALLOWED_NETWORKS``. A sent token is always checked."""
    if "Authorization" in request.headers:
        if not authenticate_token(request):
            return api_error(401, "invalid or revoked token")
        if not request.user.has_perm("channels_registry.view_channel"):
            return HttpResponseForbidden("The token's user lacks the viewer role.")
    elif not _allowed_network(request):
        response = api_error(
            401, "send Authorization: Bearer <token>, or scrape from an allowed network"
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(metrics.render_metrics(), content_type=metrics.CONTENT_TYPE)
