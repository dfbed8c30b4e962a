"""``/api/replay-plans/``: list and read replay/discard plans, and freeze a new one.

A POST goes through the same action as the page (``do_create_plan``: reason, override, four
eyes, one plan per ``request_key``); refusals by role are audited before the 403. With a session
(the browser) a POST needs the CSRF token; with a bearer token it does not.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from django.urls import path, reverse
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema, extend_schema_field
from rest_framework import exceptions, serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from audit.actions import Actor
from dlq.models import PlanKind, PlanStatus, ReplayPlan
from dlq.plans.actions import PlanRefused, do_create_plan
from dlq.plans.preview import DEFAULT_VELOCITY, MAX_VELOCITY, Selection, build_preview
from dlq.triage.access import entries_for_user, get_plan_for_user, plans_for_user, require_action
from dlq.triage.api import CURSOR_ERRORS, EntryFilterParams, entry_filter
from dlq.triage.filters import PAGE_SIZE

MAX_IDS = 10_000
REASON_CHARS = 2000
# A reason with something in it: a character that ``str.strip()`` keeps. Written out (not
# ``\S``) so that the schema's pattern means the same in every regex dialect.
_SPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NON_BLANK = f"[^{_SPACE}]"
_NON_BLANK = re.compile(NON_BLANK)


class PlanConflict(exceptions.APIException):
    """A well-formed request the entries' current state refuses (nothing eligible any more, a
    declaration blocks it): 409, as the schema says, not a 400 for a valid body."""

    status_code = 409
    default_code = "conflict"


class PlanSerializer(serializers.Serializer[ReplayPlan]):
    id = serializers.IntegerField(source="pk")
    url = serializers.CharField(source="get_absolute_url", help_text="The plan's page.")
    kind = serializers.ChoiceField(choices=PlanKind.choices)
    status = serializers.ChoiceField(choices=PlanStatus.choices)
    channel = serializers.CharField(source="channel.slug", help_text="Channel slug.")
    target = serializers.SerializerMethodField()
    total = serializers.IntegerField(
        help_text="Entries of the plan (while freezing: the entries selected at confirmation)."
    )
    frozen = serializers.IntegerField(help_text="Entries frozen so far (status freezing).")
    velocity = serializers.FloatField(allow_null=True, help_text="Messages per second.")
    canary_size = serializers.IntegerField()
    sent = serializers.IntegerField(help_text="Publishes made (retries included).")
    sent_entries = serializers.IntegerField(help_text="Distinct entries published.")
    maybe_twice = serializers.IntegerField(help_text="Entries that may have gone out twice.")
    outages = serializers.IntegerField(help_text="Times the relay waited for the broker.")
    waiting_since = serializers.DateTimeField(
        allow_null=True, help_text="Broker unreachable since (status waiting_broker)."
    )
    confirmed = serializers.IntegerField()
    failed = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    discarded = serializers.IntegerField()
    pending = serializers.IntegerField()
    warnings = serializers.JSONField()
    override = serializers.BooleanField()
    needs_approval = serializers.BooleanField()
    requested_by = serializers.CharField(source="requested_by_username")
    approved_by = serializers.SerializerMethodField()
    reason = serializers.CharField()
    selection = serializers.JSONField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    status_note = serializers.CharField()

    def get_target(self, plan: ReplayPlan) -> str | None:
        return plan.target_display or None

    def get_approved_by(self, plan: ReplayPlan) -> str | None:
        return plan.approved_by_username or None


class PlanPageSerializer(serializers.Serializer[Any]):
    results = PlanSerializer(many=True)
    next = serializers.URLField(allow_null=True, help_text="The next page, or null.")


class PlanListParams(serializers.Serializer[Any]):
    status = serializers.ChoiceField(
        choices=PlanStatus.choices,
        required=False,
        allow_blank=True,
        error_messages={"invalid_choice": "unknown status"},
    )
    after = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2**63 - 1,
        error_messages=dict.fromkeys(CURSOR_ERRORS, "after must be a plan id"),
        help_text="Cursor: plans with a smaller id (what `next` carries).",
    )


# The JSON type each body field must have (None is allowed where the field allows it). DRF's
# fields coerce ("reason": 0 becomes "0", "preview": 1 becomes true); the schema promises types.
_STRING: tuple[type, ...] = (str,)
_NUMBER: tuple[type, ...] = (int, float)
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "kind": _STRING, "channel": _STRING, "group": (int,), "preview": (bool,),
    "reason": _STRING, "request_key": _STRING, "rate": _NUMBER, "canary_size": (int,),
    "canary_wait_s": _NUMBER, "override_reason": _STRING,
}  # fmt: skip
_TYPE_NAMES: dict[tuple[type, ...], str] = {
    _STRING: "a string",
    _NUMBER: "a number",
    (bool,): "a boolean",
    (int,): "an integer",
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type_errors(data: dict[str, Any]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for name, types in JSON_TYPES.items():
        value = data.get(name)
        if value is None:
            continue
        # bool is an int in Python, but not a number in JSON.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            errors[name] = [f"must be {_TYPE_NAMES[types]}"]
    filters, ids = data.get("filter"), data.get("ids")
    if isinstance(filters, dict) and not all(
        isinstance(v, str) or _is_int(v) for v in filters.values()
    ):
        errors["filter"] = ["filter values must be strings or integers"]
    if isinstance(ids, list) and not all(_is_int(i) for i in ids):
        errors["ids"] = ["ids must be a list of entry ids (integers)"]
    return errors


@extend_schema_field(
    {"oneOf": [{"type": "string"}, {"type": "integer"}]}  # what _json_type_errors allows
)
class FilterValueField(serializers.CharField):
    pass


class PlanRequestSerializer(serializers.Serializer[Any]):
    """What ``POST /api/replay-plans/`` accepts. The entries are ``ids`` when given, else the
    dead-letter list's filters (``filter``, ``channel``, ``group``)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and (errors := _json_type_errors(data)):
            raise serializers.ValidationError(errors)
        return super().to_internal_value(data)

    kind = serializers.ChoiceField(choices=PlanKind.choices, default=PlanKind.REPLAY)
    channel = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    group = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=2**63 - 1
    )
    filter = serializers.DictField(
        child=FilterValueField(allow_blank=True),
        required=False,
        allow_null=True,
        error_messages={"not_a_dict": "filter must be an object of the list's filter parameters"},
        help_text="The dead-letter list's filter parameters (channel, status, since, q, …).",
    )
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        required=False,
        allow_null=True,
        max_length=MAX_IDS,
    )
    preview = serializers.BooleanField(
        default=False, help_text="Only preview: what would be acted on, with the warnings."
    )
    reason = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    request_key = serializers.CharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        help_text="Idempotency key (≤ 64 characters): the same key answers the same plan.",
    )
    rate = serializers.FloatField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=MAX_VELOCITY,
        help_text="Replay: messages per second (0 or null: the default).",
    )
    canary_size = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=10_000
    )
    canary_wait_s = serializers.FloatField(
        required=False, allow_null=True, min_value=1, max_value=3600
    )
    override_reason = serializers.CharField(required=False, allow_blank=True, allow_null=True)

    def validate_rate(self, value: float | None) -> float:
        # ``not a < x <= b`` also refuses NaN, which every comparison answers False.
        if not value:
            return DEFAULT_VELOCITY
        if not 0 < value <= MAX_VELOCITY:
            raise serializers.ValidationError(f"rate must be in (0, {MAX_VELOCITY:g}]")
        return value

    def validate_canary_wait_s(self, value: float | None) -> float:
        if value is None:
            return 30.0
        if not 1 <= value <= 3600:
            raise serializers.ValidationError("canary_wait_s must be in [1, 3600]")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("preview") and not _NON_BLANK.search(attrs.get("reason") or ""):
            raise serializers.ValidationError(
                {"reason": ["give a reason (required unless preview is true)"]}
            )
        params = dict(attrs.get("filter") or {})
        for key in ("channel", "group"):
            if attrs.get(key) is not None:
                params[key] = str(attrs[key])
        checked = EntryFilterParams(data=params)
        if not checked.is_valid():
            raise serializers.ValidationError({"filter": [str(checked.errors)]})
        attrs["selection"] = Selection(
            entry_filter(dict(checked.validated_data)), sorted(set(attrs.get("ids") or []))
        )
        return attrs


class PreviewSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=PlanKind.choices)
    channel = serializers.CharField(allow_null=True)
    selection = serializers.JSONField()
    matched = serializers.IntegerField()
    eligible = serializers.IntegerField()
    excluded = serializers.DictField(child=serializers.IntegerField())
    target = serializers.CharField(allow_null=True)
    warnings = serializers.ListField(child=serializers.JSONField())
    blocked = serializers.BooleanField()
    needs_approval = serializers.BooleanField()
    four_eyes_threshold = serializers.IntegerField()
    errors = serializers.ListField(child=serializers.CharField())  # type: ignore[assignment]


def _create_plan(request: Request) -> Response:
    """1. the body is an object with a known kind; 2. the role (a refusal is audited);
    3. the rest of the body; 4. preview, or freeze the plan through the action."""
    body = request.data
    if not isinstance(body, dict):
        raise serializers.ValidationError({"body": ["the body must be a JSON object"]})
    kind = body.get("kind", PlanKind.REPLAY)
    if kind not in PlanKind.values:
        raise serializers.ValidationError({"kind": ["kind must be replay or discard"]})
    django_request = request._request
    require_action(django_request, kind, f"{kind} via API")
    checked = PlanRequestSerializer(data=body)
    checked.is_valid(raise_exception=True)
    data = checked.validated_data
    entries = entries_for_user(django_request)
    if data["preview"]:
        return Response(build_preview(kind, data["selection"], entries).as_json())
    options: dict[str, Any] = {}
    if kind == PlanKind.REPLAY:
        options = {
            "velocity": data.get("rate") or DEFAULT_VELOCITY,
            "canary_size": data.get("canary_size") or 0,
            "canary_wait_s": data.get("canary_wait_s") or 30.0,
            "override": bool(data.get("override_reason")),
            "override_reason": (data.get("override_reason") or "")[:REASON_CHARS],
        }
    try:
        plan, created = do_create_plan(
            kind,
            data["selection"],
            entries,
            actor=Actor.from_request(django_request),
            reason=(data.get("reason") or "").strip()[:REASON_CHARS],
            request_key=(data.get("request_key") or "")[:64] or None,
            **options,
        )
    except PlanRefused as exc:
        raise PlanConflict(str(exc)) from None
    return Response(PlanSerializer(plan).data, status=201 if created else 200)


def _list_plans(request: Request) -> Response:
    plans = plans_for_user(request._request).order_by("-id")
    params = PlanListParams(data=request.query_params)
    params.is_valid(raise_exception=True)
    status = params.validated_data.get("status", "")
    if status:
        plans = plans.filter(status=status)
    after = params.validated_data.get("after")
    if after:
        plans = plans.filter(pk__lt=after)
    rows = list(plans[: PAGE_SIZE + 1])
    next_url = None
    if len(rows) > PAGE_SIZE:
        query = {"after": rows[PAGE_SIZE - 1].pk, **({"status": status} if status else {})}
        next_url = request.build_absolute_uri(f"{reverse('replay_plan_api')}?{urlencode(query)}")
    results = PlanSerializer(rows[:PAGE_SIZE], many=True).data  # type: ignore[arg-type]
    return Response({"results": results, "next": next_url})


@extend_schema(
    methods=["GET"],
    operation_id="replay_plans_list",
    parameters=[PlanListParams],
    responses={200: PlanPageSerializer},
)
@extend_schema(
    methods=["POST"],
    operation_id="replay_plans_create",
    request=PlanRequestSerializer,
    responses={
        201: PlanSerializer,
        200: PolymorphicProxySerializer(
            component_name="PlanOrPreview",
            serializers=[PlanSerializer, PreviewSerializer],
            resource_type_field_name=None,
        ),
    },
    description="Freeze a replay or discard plan (on-call role), or only preview it.",
)
@api_view(["GET", "POST"])
def replay_plan_list(request: Request) -> Response:
    """GET: plans, newest first (viewer role). POST: freeze a plan (on-call role; the same
    rules as the page: reason, override, four eyes; ``"preview": true`` only previews)."""
    if request.method == "POST":
        return _create_plan(request)
    return _list_plans(request)


@extend_schema(operation_id="replay_plans_retrieve", responses={200: PlanSerializer})
@api_view(["GET"])
def replay_plan_detail(request: Request, pk: int) -> Response:
    """One plan (viewer role)."""
    return Response(PlanSerializer(get_plan_for_user(request._request, pk)).data)


def plan_request_schema(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular post-processing hook: what a plan request needs beyond its fields'
    types, so that every body the schema allows is one the server takes. A plan (not a
    preview) needs a reason with a non-space character; ``reason`` may be null or absent only
    with ``"preview": true``. A refusal by the entries' state is a 409."""
    operation = result.get("paths", {}).get("/api/replay-plans/", {}).get("post")
    if operation is None:
        return result
    operation["requestBody"]["required"] = True  # no body is no reason, and not a preview
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    name = body["$ref"].rsplit("/", 1)[1]
    component = result["components"]["schemas"][name]
    component["properties"]["reason"]["description"] = (
        "Why (required unless preview is true): at least one non-space character."
    )
    # The filter's keys are the dead-letter list's parameters, with their types (one
    # definition); other keys are ignored.
    listing = result["paths"].get("/api/dead-letters/", {}).get("get", {})
    typed = {p["name"]: p["schema"] for p in listing.get("parameters", [])
             if p.get("in") == "query" and p["name"] in EntryFilterParams().fields}  # fmt: skip
    component["properties"]["filter"]["properties"] = typed
    component["anyOf"] = [
        {"required": ["preview"], "properties": {"preview": {"enum": [True]}}},
        {
            "required": ["reason"],
            "properties": {"reason": {"type": "string", "pattern": NON_BLANK}},
        },
    ]
    operation["responses"]["409"] = {
        "description": "Refused by the entries' state or the channel's declaration.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    return result


urlpatterns = [
    path("", replay_plan_list, name="replay_plan_api"),
    path("<int:pk>/", replay_plan_detail, name="replay_plan_api_detail"),
]
