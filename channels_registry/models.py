"""Broker and Channel declarations: what each channel promises (its delivery contract)."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import connection, models
from django.db.models.functions import Greatest, Lower
from django.urls import reverse

from brokers.base import BrokerAdapter
from channels_registry.health import SEVERITY, HealthState, severity_of


class BrokerKind(models.TextChoices):
    RABBITMQ = "rabbitmq", "RabbitMQ"
    REDIS = "redis", "Redis Streams"
    NATS = "nats", "NATS JetStream"
    ACTIVEMQ = "activemq", "ActiveMQ Classic"


URL_SCHEMES = {
    BrokerKind.RABBITMQ: ("amqp", "amqps"),
    BrokerKind.REDIS: ("redis", "rediss", "unix"),
    BrokerKind.NATS: ("nats", "tls"),
    BrokerKind.ACTIVEMQ: ("stomp", "stomp+ssl", "stomp+tls"),
}


class BrokerConfigError(Exception):
    """A broker declaration that cannot be turned into a connection (shown to the user)."""


URL_ENV_PREFIX = "DLO_BROKER_"
# Settings that share the prefix but hold no URL.
_NOT_URL_ENV = {"DLO_BROKER_TIMEOUT_S", "DLO_BROKER_URL_ENV_ALLOW", "DLO_BROKER_CREDENTIAL_HOSTS"}


def url_env_allowed(name: str) -> bool:
    """May a Broker take its URL from the environment variable ``name``? Only names starting
    with ``DLO_BROKER_`` or listed in ``DLO_BROKER_URL_ENV_ALLOW``: a registry admin must not
    be able to point a broker at ``SECRET_KEY`` and read it back from an error message."""
    from django.conf import settings

    if name in settings.DLO_BROKER_URL_ENV_ALLOW:
        return True
    return (
        name.startswith(URL_ENV_PREFIX)
        and len(name) > len(URL_ENV_PREFIX)
        and (name not in _NOT_URL_ENV)
    )


def url_env_refusal(name: str) -> str:
    return (
        f"{name} is not a broker URL variable: name one starting with {URL_ENV_PREFIX} "
        f"(e.g. {URL_ENV_PREFIX}RABBITMQ_URL), or ask the operator to list it in "
        "DLO_BROKER_URL_ENV_ALLOW."
    )


def _split_url(url: str) -> SplitResult | None:
    """``urlsplit``, or None for text it refuses (an unclosed IPv6 bracket, a bad port)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parses the port, which raises for a bad one
    except ValueError:
        return None
    return parts


def redact_url(url: str) -> str:
    """The URL with any password replaced, for display."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


class HttpsURLField(models.URLField):
    """A URL field whose form assumes https:// for scheme-less input."""

    def formfield(self, **kwargs: Any) -> Any:
        return super().formfield(**{"assume_scheme": "https", **kwargs})


class Broker(models.Model):
    """A broker the dashboard polls. Its connection URL is given by reference to an environment
    variable (``url_env``) or stored as a secret (``url_secret``) that is never rendered back."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=BrokerKind.choices)
    url_env = models.CharField(
        "URL environment variable",
        max_length=100,
        blank=True,
        help_text="Name of the environment variable holding the connection URL, e.g. "
        "DLO_BROKER_RABBITMQ_URL (names start with DLO_BROKER_ unless the operator allows "
        "others). Preferred over a stored secret.",
    )
    url_secret = models.CharField(
        "stored connection URL",
        max_length=500,
        blank=True,
        help_text="Used only when no environment variable is named. Write-only: never shown.",
    )
    management_url = models.CharField(
        "management / metrics URL",
        max_length=300,
        blank=True,
        help_text="RabbitMQ: the management API (http://host:15672) or the Prometheus "
        "endpoint (http://host:15692/metrics); credentials are taken from the connection URL. "
        "NATS: the monitoring port (http://host:8222, optionally ?acc=ACCOUNT). "
        "Not used for Redis.",
    )
    enabled = models.BooleanField(default=True)
    poll_interval_s = models.PositiveIntegerField(
        "poll interval (seconds)", default=15, validators=[MinValueValidator(5)]
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if not self.url_env and not self.url_secret:
            errors["url_env"] = "Name an environment variable holding the URL, or store one."
        if self.url_env and not (
            self.url_env.isascii() and self.url_env.replace("_", "").isalnum()
        ):
            errors["url_env"] = (
                "Use letters, digits and underscores only, e.g. DLO_BROKER_RABBITMQ_URL."
            )
        elif self.url_env and not url_env_allowed(self.url_env):
            errors["url_env"] = url_env_refusal(self.url_env)
        secret_parts = _split_url(self.url_secret) if self.url_secret else None
        if self.url_secret and secret_parts is None:
            errors["url_secret"] = "This is not a valid URL."
        elif secret_parts is not None:
            scheme = secret_parts.scheme
            allowed = URL_SCHEMES.get(BrokerKind(self.kind), ()) if self.kind else ()
            if allowed and scheme not in allowed:
                errors["url_secret"] = (
                    f"A {self.get_kind_display()} URL starts with "
                    + " or ".join(f"{s}://" for s in allowed)
                    + "."
                )
        if self.management_url:
            if self.kind not in (BrokerKind.RABBITMQ, BrokerKind.NATS):
                errors["management_url"] = (
                    "Only RabbitMQ (management or Prometheus) and NATS (monitoring port) "
                    "brokers use a management URL."
                )
            elif (parts := _split_url(self.management_url)) is None or parts.scheme not in (
                "http",
                "https",
            ):
                errors["management_url"] = "Give an http:// or https:// URL."
            elif parts.password:
                errors["management_url"] = (
                    "Leave credentials out: they are taken from the connection URL."
                )
        if errors:
            raise ValidationError(errors)

    def connection_url(self) -> str:
        """The URL to connect with. Raises ``BrokerConfigError`` if it cannot be resolved."""
        if self.url_env:
            if not url_env_allowed(self.url_env):  # declared before the rule, or by hand
                raise BrokerConfigError(url_env_refusal(self.url_env))
            value = os.environ.get(self.url_env, "")
            if not value:
                raise BrokerConfigError(
                    f"Environment variable {self.url_env} is not set on this server."
                )
            return value
        if self.url_secret:
            return self.url_secret
        raise BrokerConfigError("No connection URL is configured.")

    def config_problems(self) -> list[str]:
        """What keeps this broker from being polled, or is ambiguous, in words for the admin
        form and the channel page (the variable's name only, never a value)."""
        problems = []
        if self.url_env and self.url_secret:
            problems.append(
                f"Both an environment variable ({self.url_env}) and a stored URL are set: the"
                " variable is used and the stored URL ignored. Clear one of them."
            )
        if self.url_env and not os.environ.get(self.url_env):
            problems.append(
                f"Environment variable {self.url_env} is not set on this server: the broker"
                " cannot be polled until it is (restart the web and worker processes after"
                " setting it)."
            )
        if not self.url_env and not self.url_secret:
            problems.append("No connection URL is configured: name an environment variable.")
        return problems

    def adapter(self, installation: str | None = None) -> BrokerAdapter:
        """The one way to build this broker's adapter (polling, ingest, the relay, the retry
        view): its kind, URL and options, this installation's id (which names the NATS drain
        and copy consumers), and the settings every caller shares (the stall window a consumer
        counts as attached within; the NATS drain's ack wait and pending cap). Raises
        ``BrokerConfigError`` when the URL cannot be resolved.

        ``installation``: the id when the caller has read it already. Polling does, before its
        worker threads build adapters: those must not touch the database (a thread's query
        would wait on the caller's open transaction). Otherwise a NATS adapter reads it here."""
        from django.conf import settings

        from brokers import get_adapter
        from brokers.nats_jetstream import NatsJetStreamAdapter

        adapter = get_adapter(self.kind, self.connection_url(), **self.adapter_options())
        if installation is None:
            installation = installation_id() if self.kind == BrokerKind.NATS else ""
        adapter.installation_id = installation
        # A consumer silent for the stall window no longer counts as attached (Redis, NATS pull).
        adapter.active_idle_s = float(settings.DLO_HEALTH_STALL_S)
        if isinstance(adapter, NatsJetStreamAdapter):
            adapter.drain_ack_wait_s = float(settings.DLO_NATS_DRAIN_ACK_WAIT_S)
            adapter.drain_max_ack_pending = int(settings.DLO_NATS_DRAIN_MAX_ACK_PENDING)
        return adapter

    def adapter_options(self) -> dict[str, Any]:
        """The adapter's keyword arguments besides the URL (``adapter``)."""
        from django.conf import settings

        return {
            "management_url": self.management_url or None,
            "timeout": float(settings.DLO_BROKER_TIMEOUT_S),
            "credential_hosts": tuple(settings.DLO_BROKER_CREDENTIAL_HOSTS),
        }

    @property
    def stale_after_s(self) -> float:
        """A sample older than this is stale: three missed polls, and never under a minute."""
        return max(60.0, 3.0 * self.poll_interval_s)

    @property
    def url_source(self) -> str:
        """Where the URL comes from, safe to display."""
        if self.url_env:
            return f"${self.url_env}"
        return "stored secret" if self.url_secret else "not configured"

    def audit_snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "url_env": self.url_env,
            "url_secret": "(set)" if self.url_secret else "",
            "management_url": self.management_url,
            "enabled": self.enabled,
            "poll_interval_s": self.poll_interval_s,
        }


class Semantic(models.TextChoices):
    UNSTATED = "", "— not stated —"
    AT_MOST_ONCE = "at-most-once", "At-most-once"
    AT_LEAST_ONCE = "at-least-once", "At-least-once"
    EXACTLY_ONCE = "exactly-once-via-idempotency", "Exactly-once via idempotency"


class Ordering(models.TextChoices):
    UNSTATED = "", "— not stated —"
    NONE = "none", "None"
    PER_KEY = "per-key", "Per key"
    FIFO_GROUP = "fifo-group", "FIFO group"
    GLOBAL = "global", "Global"


class IdempotencySource(models.TextChoices):
    NONE = "", "— none —"
    HEADER = "header", "Header"
    JSON_PATH = "json-path", "JSON path in the body"
    PROPERTY = "message-id", "Message id property"


class DedupScope(models.TextChoices):
    PER_MESSAGE = "per-message", "Per message"
    PER_PRODUCER = "per-producer", "Per producer"


class PartitionMechanism(models.TextChoices):
    """What pins each ordering key to one consumer when several consume (P2/P7)."""

    NONE = "", "— none —"
    CONSISTENT_HASH = "consistent-hash", "Consistent-hash exchange (one queue per consumer)"
    KEY_RANGE = "key-range", "One consumer per key range (e.g. one Redis stream per shard)"
    PER_SUBJECT = "per-subject", "Per-subject consumers (NATS subject per key)"


class EntryLayout(models.TextChoices):
    """How a Redis Streams dead-letter entry holds the message (see brokers.redis_streams)."""

    BODY_FIELD = "body-field", "One field holds the message; the others are headers"
    FIELD_MAP = "field-map", "The field map is the message; named fields are error metadata"


class MessageTypeSource(models.TextChoices):
    AUTO = "", "— recognise Celery and Sidekiq jobs —"
    HEADER = "header", "Header"
    JSON_PATH = "json-path", "JSON path in the body"


class SchemaCompatibility(models.TextChoices):
    NONE = "", "— not checked —"
    BACKWARD = "backward", "Backward (new readers read old messages)"
    FORWARD = "forward", "Forward (old readers read new messages)"
    FULL = "full", "Full (both)"


class DlqStrategy(models.TextChoices):
    RETRY_COUNT = "retry-count-limit", "Retry-count limit"
    TTL_BACKOFF = "ttl-with-backoff", "TTL with backoff"
    POISON_QUEUE = "poison-queue", "Poison queue"
    DLQ_ALERT = "dlq-alert", "DLQ + alert"


class Channel(models.Model):
    """One channel (a queue; a stream + group; a stream + consumer) and its declared contract.

    ``findings`` caches the declaration checks of the last save (see ``checks.py``) so lists
    stay fast; it is recomputed by every save action.
    """

    broker = models.ForeignKey(Broker, on_delete=models.PROTECT, related_name="channels")
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    address = models.CharField(
        max_length=255, help_text="RabbitMQ queue, Redis stream key, or NATS stream."
    )
    address_group = models.CharField(
        "consumer group / consumer",
        max_length=255,
        blank=True,
        help_text="Redis consumer group or NATS durable consumer. Empty for RabbitMQ.",
    )
    owner_team = models.CharField(max_length=100, blank=True, db_index=True)
    runbook_url = HttpsURLField(blank=True)
    description = models.TextField(blank=True)

    # P4: delivery semantic.
    semantic = models.CharField(max_length=32, choices=Semantic.choices, blank=True)
    # P2/P7: ordering and partitioning.
    ordering = models.CharField(max_length=16, choices=Ordering.choices, blank=True)
    ordering_key = models.CharField("ordering / partition key", max_length=200, blank=True)
    ordering_rationale = models.TextField("why this key", blank=True)
    single_active_consumer = models.BooleanField(
        default=False, help_text="Only one consumer receives at a time (needed for global order)."
    )
    partition_mechanism = models.CharField(
        "partitioning mechanism",
        max_length=32,
        choices=PartitionMechanism.choices,
        blank=True,
        help_text="How per-key order survives several consumers (single active consumer aside).",
    )
    # P3: idempotency.
    idempotency_source = models.CharField(
        "idempotency key location", max_length=16, choices=IdempotencySource.choices, blank=True
    )
    idempotency_key = models.CharField(
        "idempotency header name or JSON path",
        max_length=200,
        blank=True,
        help_text="e.g. Idempotency-Key, or $.order.id",
    )
    dedup_scope = models.CharField(
        max_length=16, choices=DedupScope.choices, default=DedupScope.PER_MESSAGE
    )
    dedup_ttl_s = models.PositiveIntegerField("dedup store TTL (s)", null=True, blank=True)
    dedup_store_shared = models.BooleanField("dedup store shared by all consumers", default=True)
    shared_subscription = models.BooleanField(
        "shared subscription (competing consumers)", default=False
    )
    consumer_idempotent = models.BooleanField("processing is idempotent by itself", default=False)
    mark_in_transaction = models.BooleanField(
        "dedup mark commits with the processing", default=False
    )
    # P5/P6: retry budget and backoff.
    retry_max_attempts = models.PositiveIntegerField(null=True, blank=True)
    retry_ttl_s = models.PositiveIntegerField("retry TTL (s)", null=True, blank=True)
    backoff_base_s = models.FloatField("backoff base (s)", null=True, blank=True)
    backoff_factor = models.FloatField(null=True, blank=True)
    backoff_cap_s = models.FloatField("backoff cap (s)", null=True, blank=True)
    backoff_jitter = models.BooleanField(default=False)
    # Where messages wait for their next attempt, when that is an address of its own.
    retry_address = models.CharField(
        "retry address",
        max_length=255,
        blank=True,
        help_text="RabbitMQ: the TTL retry (delay) queue whose expired messages go back to "
        "the work queue. Redis and NATS keep retries pending on the channel itself.",
    )
    max_in_flight = models.PositiveIntegerField("max unacked / prefetch", null=True, blank=True)
    ack_timeout_s = models.PositiveIntegerField(
        "ack / processing timeout (s)",
        null=True,
        blank=True,
        help_text="How long one attempt may hold a message unacknowledged before it counts as "
        "stuck and is redelivered (RabbitMQ consumer_timeout, NATS ack_wait, Redis idle time "
        "before XAUTOCLAIM).",
    )
    # P5: dead-letter handling.
    dlq_strategies = models.JSONField("DLQ strategy", default=list, blank=True)
    dlq_address = models.CharField("DLQ address", max_length=255, blank=True)
    poison_address = models.CharField(max_length=255, blank=True)
    # NATS JetStream has no DLQ: a consumer that gives up publishes an advisory. Capture means
    # the dashboard keeps those advisories (account-wide stream DLO_ADVISORIES, docs/identity.md)
    # and ingests each as a dead letter, its message read back from the stream.
    nats_advisory_capture = models.BooleanField(
        "capture NATS dead-letter advisories",
        default=False,
        help_text="NATS only: ingest the MAX_DELIVERIES and MSG_TERMINATED advisories of this "
        "stream and consumer as dead letters. A real DLQ stream, if the application keeps one, "
        "goes in the DLQ address and is sampled for its depth.",
    )
    dlq_records_reason = models.BooleanField("dead letters carry reason metadata", default=True)
    # P8: retention. P1/P9: schema.
    retention_s = models.PositiveIntegerField("retention (s)", null=True, blank=True)
    schema_name = models.CharField(max_length=200, blank=True)
    schema_version = models.CharField(max_length=50, blank=True)
    schema_compatibility = models.CharField(
        max_length=16,
        choices=SchemaCompatibility.choices,
        blank=True,
        help_text="Checked when a new version of this channel's schema is registered.",
    )
    # How messages are written (entry layout for Redis, the job type for triage).
    entry_layout = models.CharField(
        "Redis entry layout",
        max_length=16,
        choices=EntryLayout.choices,
        default=EntryLayout.BODY_FIELD,
        blank=True,
        help_text="Redis Streams only: how a dead-letter entry holds the original message "
        "(empty: one body field).",
    )
    entry_body_field = models.CharField(
        "Redis body field",
        max_length=100,
        default="body",
        blank=True,
        help_text="For the body-field layout (empty: body).",
    )
    entry_metadata_fields = models.JSONField(
        "Redis error / metadata fields",
        default=list,
        blank=True,
        help_text="For the field-map layout: fields a reaper adds (reason, x-error-*); a "
        "trailing * matches a prefix. Empty: the usual names.",
    )
    message_type_source = models.CharField(
        "message type location", max_length=16, choices=MessageTypeSource.choices, blank=True
    )
    message_type_key = models.CharField(
        "message type header or JSON path",
        max_length=200,
        blank=True,
        help_text="e.g. task (Celery's header), or $.type",
    )
    # P10: alert thresholds.
    alert_dlq_depth = models.PositiveIntegerField("alert: DLQ depth", null=True, blank=True)
    alert_lag_messages = models.PositiveIntegerField(
        "alert: backlog (messages)", null=True, blank=True
    )
    alert_lag_seconds = models.PositiveIntegerField("alert: lag (seconds)", null=True, blank=True)
    alert_oldest_age_s = models.PositiveIntegerField(
        "alert: oldest message age (s)", null=True, blank=True
    )
    alert_min_consumers = models.PositiveIntegerField(
        "alert: minimum consumers", null=True, blank=True
    )
    # Redaction for viewers without the reveal permission.
    redact_json_paths = models.JSONField("redact JSON paths", default=list, blank=True)
    redact_headers = models.JSONField("redact headers", default=list, blank=True)

    enabled = models.BooleanField(default=True)
    # True until the channel's first health row is written: the board finds never-polled
    # channels through a small partial index instead of anti-joining every channel.
    awaiting_health = models.BooleanField(default=True, editable=False)
    # The health row's state and DLQ flags (" dlq-inflow dlq-aged "), copied here when they
    # change, so the board counts states over this narrow table, not the wide health rows.
    board_state = models.CharField(max_length=16, default="unknown", editable=False)
    board_flags = models.CharField(max_length=100, blank=True, editable=False)
    findings = models.JSONField(default=list, blank=True, editable=False)
    error_count = models.PositiveIntegerField(default=0, editable=False)
    warning_count = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(
                fields=["broker", "address", "address_group"], name="channel_unique_address"
            )
        ]
        indexes = [
            models.Index(
                Lower("name"),
                "id",
                condition=models.Q(awaiting_health=True),
                name="channel_awaiting_health",
            ),
            # The board's counts per state and flag: an index-only scan of polled channels.
            models.Index(
                fields=["board_state", "board_flags", "owner_team", "broker"],
                condition=models.Q(enabled=True, awaiting_health=False),
                name="channel_board_counts",
            ),
        ]
        permissions = [("reveal_channel_payload", "Can reveal redacted payload fields")]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("channel_detail", args=[self.slug])

    @classmethod
    def owner_teams(cls) -> list[str]:
        """Every owner team named by a channel, sorted, for the board's team filter.

        On PostgreSQL a skip scan of the ``owner_team`` index: the next team after the last
        one found, until there is none (one probe per team; ``DISTINCT`` reads all 10,000
        channels to find 10). Elsewhere the plain ``DISTINCT``.
        """
        if connection.vendor == "postgresql":
            table = cls._meta.db_table
            with connection.cursor() as cursor:
                cursor.execute(
                    f"""WITH RECURSIVE teams(team) AS (
                        (SELECT owner_team FROM {table} WHERE owner_team > ''
                         ORDER BY owner_team LIMIT 1)
                        UNION ALL
                        SELECT (SELECT c.owner_team FROM {table} c
                                WHERE c.owner_team > teams.team ORDER BY c.owner_team LIMIT 1)
                        FROM teams WHERE teams.team IS NOT NULL
                    ) SELECT team FROM teams WHERE team IS NOT NULL"""
                )
                return [team for (team,) in cursor.fetchall()]
        teams = cls.objects.exclude(owner_team="").order_by("owner_team")
        return list(teams.values_list("owner_team", flat=True).distinct())

    @property
    def address_display(self) -> str:
        return f"{self.address} / {self.address_group}" if self.address_group else self.address

    @property
    def has_dlq(self) -> bool:
        return bool(self.dlq_address) or self.nats_advisory_capture

    def clean(self) -> None:
        errors: dict[str, str] = {}
        kind = self.broker.kind if self.broker_id else None
        if kind in (BrokerKind.REDIS, BrokerKind.NATS) and not self.address_group:
            noun = "consumer group" if kind == BrokerKind.REDIS else "durable consumer"
            errors["address_group"] = f"A {BrokerKind(kind).label} channel needs its {noun}."
        if self.nats_advisory_capture and kind != BrokerKind.NATS:
            errors["nats_advisory_capture"] = "Advisory capture exists on NATS JetStream only."
        if kind == BrokerKind.RABBITMQ and self.address_group:
            errors["address_group"] = "RabbitMQ channels are a queue only; leave this empty."
        if kind == BrokerKind.ACTIVEMQ and self.address_group:
            errors["address_group"] = "ActiveMQ channels are a queue only; leave this empty."
        if self.idempotency_source in (IdempotencySource.HEADER, IdempotencySource.JSON_PATH):
            if not self.idempotency_key:
                errors["idempotency_key"] = "Name the header or JSON path holding the key."
            elif self.idempotency_source == IdempotencySource.JSON_PATH and not (
                self.idempotency_key.startswith("$.")
            ):
                errors["idempotency_key"] = "A JSON path starts with $. (e.g. $.order.id)."
        unknown = [s for s in self.dlq_strategies or [] if s not in DlqStrategy.values]
        if unknown:
            errors["dlq_strategies"] = f"Unknown strategy: {', '.join(map(str, unknown))}."
        if self.backoff_factor is not None and self.backoff_factor < 1:
            errors["backoff_factor"] = "A backoff factor below 1 shrinks the delay; use ≥ 1."
        if (
            self.backoff_cap_s is not None
            and self.backoff_base_s is not None
            and self.backoff_cap_s < self.backoff_base_s
        ):
            errors["backoff_cap_s"] = "The cap must be at least the base delay."
        for name in ("dlq_address", "poison_address", "retry_address"):
            if getattr(self, name) and getattr(self, name) == self.address:
                errors[name] = "Must differ from the channel's own address."
        if self.message_type_source == MessageTypeSource.JSON_PATH and not (
            self.message_type_key.startswith("$.")
        ):
            errors["message_type_key"] = "A JSON path starts with $. (e.g. $.type)."
        if self.message_type_source == MessageTypeSource.HEADER and not self.message_type_key:
            errors["message_type_key"] = "Name the header holding the message type."
        for name in ("redact_json_paths", "redact_headers", "entry_metadata_fields"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                errors[name] = "Give a list of strings."
        if errors:
            raise ValidationError(errors)

    def audit_snapshot(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for field in self._meta.concrete_fields:
            if field.name in {"id", "findings", "created_at", "updated_at"}:
                continue
            data[field.attname] = getattr(self, field.attname)
        return data


class Installation(models.Model):
    """This dashboard's identity on shared brokers: one row, created on first use.

    Durable broker state the dashboard owns (NATS drain consumers on DLO_ADVISORIES) is named
    after it, so two dashboards on one NATS account each see every advisory instead of
    splitting them. ``DLO_INSTALLATION_ID`` in the environment overrides it."""

    uid = models.CharField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.uid


def installation_id() -> str:
    """The stable id of this installation (see ``Installation``)."""
    from django.conf import settings

    configured = getattr(settings, "DLO_INSTALLATION_ID", "")
    if configured:
        return str(configured)
    row = Installation.objects.order_by("pk").first()
    if row is None:
        row, _ = Installation.objects.get_or_create(pk=1, defaults={"uid": uuid.uuid4().hex[:12]})
    return row.uid


class MessageSchema(models.Model):
    """One registered version of a message schema (JSON Schema). A channel's declared schema
    name and version select the one its messages are validated against (P1/P9)."""

    name = models.CharField(max_length=200)
    version = models.CharField(max_length=50)
    schema = models.JSONField(help_text="A JSON Schema document.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "created_at"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="schema_unique_version")
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def audit_snapshot(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "schema": self.schema}


# --- Polling, samples and health (issue 3) -------------------------------------------------


class BrokerPollState(models.Model):
    """Per-broker polling bookkeeping: the single-flight lease, backoff and circuit breaker."""

    broker = models.OneToOneField(
        Broker, on_delete=models.CASCADE, primary_key=True, related_name="poll_state"
    )
    # Single flight: a poll claims the broker by setting the lease with a conditional UPDATE.
    lease_until = models.DateTimeField(null=True, blank=True)
    lease_token = models.CharField(max_length=32, blank=True)
    next_due_at = models.DateTimeField(null=True, blank=True)
    circuit_open_until = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    overruns = models.PositiveIntegerField(default=0)
    polls = models.PositiveBigIntegerField(default=0)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    last_duration_ms = models.PositiveIntegerField(null=True, blank=True)
    last_round_trips = models.PositiveIntegerField(null=True, blank=True)
    last_inspect_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"poll state of {self.broker_id}"


class ChannelSample(models.Model):
    """One poll's measurement of one channel. NULL is unknown, never 0. ``stale`` rows record a
    poll that failed (all measurements NULL, ``error`` says why). Kept for a bounded window."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="samples")
    taken_at = models.DateTimeField(db_index=True)
    exists = models.BooleanField(null=True)
    stale = models.BooleanField(default=False)
    error = models.CharField(max_length=500, blank=True)
    backlog = models.BigIntegerField(null=True)
    in_flight = models.BigIntegerField(null=True)
    retained = models.BigIntegerField(null=True)
    consumers = models.IntegerField(null=True)
    active_consumers = models.IntegerField(null=True)
    redelivered = models.BigIntegerField(null=True)
    oldest_message_age_s = models.FloatField(null=True)
    oldest_unacked_age_s = models.FloatField(null=True)
    produced = models.BigIntegerField(null=True)
    delivered = models.BigIntegerField(null=True)
    acked = models.BigIntegerField(null=True)
    dead_lettered = models.BigIntegerField(null=True)
    dlq_depth = models.BigIntegerField(null=True)
    dlq_oldest_age_s = models.FloatField(null=True)
    poison_depth = models.BigIntegerField(null=True)

    class Meta:
        indexes = [models.Index(fields=["channel", "taken_at"], name="sample_channel_time")]

    def __str__(self) -> str:
        return f"{self.channel_id}@{self.taken_at:%Y-%m-%d %H:%M:%S}"


class ChannelRollup(models.Model):
    """The last sample of each minute (upserted by every poll), kept 30 days for charts."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="rollups")
    minute = models.DateTimeField(db_index=True)
    stale = models.BooleanField(default=False)
    backlog = models.BigIntegerField(null=True)
    in_flight = models.BigIntegerField(null=True)
    consumers = models.IntegerField(null=True)
    active_consumers = models.IntegerField(null=True)
    dlq_depth = models.BigIntegerField(null=True)
    poison_depth = models.BigIntegerField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "minute"], name="rollup_channel_minute")
        ]

    def __str__(self) -> str:
        return f"{self.channel_id}@{self.minute:%Y-%m-%d %H:%M}"


class ChannelHealth(models.Model):
    """The current health of one channel, updated by every poll of its broker.

    ``window`` is a bounded cache of the recent samples health needs (compact lists, see
    ``health.POINT_FIELDS``) and ``spark`` the last hour of backlog per minute, so a poll and the
    board each read one row per channel instead of scanning ``ChannelSample``.
    """

    channel = models.OneToOneField(
        Channel, on_delete=models.CASCADE, primary_key=True, related_name="health"
    )
    state = models.CharField(max_length=16, choices=HealthState.choices, default="unknown")
    state_since = models.DateTimeField(null=True, blank=True)
    severity = models.PositiveSmallIntegerField(default=0, db_index=True)
    # The board's order, kept on this row so the database walks an index instead of sorting
    # every channel: the moment the row turns stale (``updated_at`` + the broker's stale limit;
    # past it the board ranks the row as STALE) and the channel's name in lower case.
    stale_at = models.DateTimeField(null=True, blank=True, db_index=True)
    sort_name = models.CharField(max_length=200, blank=True)
    dlq_flags = models.JSONField(default=list, blank=True)
    evidence = models.JSONField(default=list, blank=True)
    backlog = models.BigIntegerField(null=True)
    in_flight = models.BigIntegerField(null=True)
    consumers = models.IntegerField(null=True)
    active_consumers = models.IntegerField(null=True)
    oldest_age_s = models.FloatField(null=True)
    lag_s = models.FloatField(null=True)
    # Dead letters on the broker, not yet ingested (docs/health.md, "Dead-letter numbers").
    dlq_depth = models.BigIntegerField(null=True)
    poison_depth = models.BigIntegerField(null=True)
    # On the broker in total (queue messages, XLEN, stream messages), ingested or not; NULL
    # where the broker keeps no DLQ of its own (NATS advisory capture alone).
    dlq_retained = models.BigIntegerField(null=True)
    poison_retained = models.BigIntegerField(null=True)
    # Stored dead letters not yet replayed or discarded (see ``health.Unresolved``), counted by
    # every poll; NULL when the channel declares no DLQ or poison address.
    dlq_unresolved = models.BigIntegerField(null=True)
    poison_unresolved = models.BigIntegerField(null=True)
    # Messages waiting for a retry, read from the poll's own sample (the channel page's
    # "Waiting to retry", without its round trip): RabbitMQ the declared retry queue's
    # messages, Redis the group's pending entries; NULL where the broker cannot say, with
    # the reason in ``retry_unknown`` (NATS: a nak'ed message and one in processing alike).
    retry_waiting = models.BigIntegerField(null=True)
    retry_unknown = models.CharField(max_length=200, blank=True, default="")
    # Dead letters the broker said were waiting when the last ingest fetched none of them
    # (held by a crashed ingester until its ack wait ends, or a stuck drain); NULL when that
    # ingest fetched something or nothing was waiting.
    ingest_stalled = models.BigIntegerField(null=True)
    ingest_checked_at = models.DateTimeField(null=True, blank=True)
    drain_rate = models.FloatField(null=True)
    eta_s = models.FloatField(null=True)
    last_sample_at = models.DateTimeField(null=True, blank=True)
    window = models.JSONField(default=list, blank=True)
    spark = models.JSONField(default=list, blank=True)
    observed = models.JSONField(null=True, blank=True)
    observed_findings = models.JSONField(default=list, blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # Fresh rows, worst first (the board's first screen is the head of this index) ...
            models.Index(
                models.F("severity").desc(), "sort_name", "channel", name="health_board_order"
            ),
            # ... and stale rows, ranked at least as STALE.
            models.Index(
                Greatest("severity", models.Value(SEVERITY[HealthState.STALE])).desc(),
                "sort_name",
                "channel",
                name="health_board_stale_order",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel_id}: {self.state}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.refresh_board_keys()
        super().save(*args, **kwargs)
        channel = self.channel
        state, flags = self.board_summary()
        if (channel.awaiting_health, channel.board_state, channel.board_flags) != (
            False,
            state,
            flags,
        ):
            Channel.objects.filter(pk=self.channel_id).update(
                awaiting_health=False, board_state=state, board_flags=flags
            )
            channel.awaiting_health, channel.board_state, channel.board_flags = False, state, flags

    def board_summary(self) -> tuple[str, str]:
        """(state, flags) as ``Channel.board_state`` and ``board_flags`` keep them."""
        flags = "".join(f" {f}" for f in self.dlq_flags or [])
        return self.state, f"{flags} " if flags else ""

    def refresh_board_keys(self) -> None:
        """Derive ``stale_at`` from ``updated_at`` and ``sort_name`` from the channel (a poll
        calls this for rows it bulk-writes; ``save`` for everything else)."""
        channel = self.channel
        self.sort_name = channel.name.lower()[:200]
        self.stale_at = (
            self.updated_at + dt.timedelta(seconds=channel.broker.stale_after_s)
            if self.updated_at is not None
            else None
        )

    def refresh_severity(self) -> int:
        """Recompute the stored ``severity`` from ``state`` and ``dlq_flags`` (the board sorts
        on it in SQL); the caller saves. Returns the new value."""
        self.severity = severity_of(self.state, self.dlq_flags or [])
        return self.severity
