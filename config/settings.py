"""Settings for Dead Letter Office, driven by environment variables only.

Embedded defaults (``make run``): SQLite file, in-memory channel layer, in-process scheduler.
Production: set ``DLO_ENV=production`` plus ``SECRET_KEY``, ``ALLOWED_HOSTS``, ``DATABASE_URL``
(PostgreSQL), ``REDIS_URL`` and ``CELERY_BROKER_URL``. Bad values fail loudly.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.periodic import beat_schedule
from dashboard.proxy import parse_networks

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise ImproperlyConfigured(f"Set the {name} environment variable.")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false).")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


PRODUCTION = env_str("DLO_ENV", "development") == "production"
DEBUG = env_bool("DEBUG", not PRODUCTION)
if PRODUCTION and DEBUG:
    # DEBUG pages show settings, SQL and tracebacks to anyone who triggers an error.
    raise ImproperlyConfigured("DEBUG must be off in production (DLO_ENV=production): unset DEBUG.")

if PRODUCTION:
    SECRET_KEY = env_str("SECRET_KEY")
    if len(SECRET_KEY) < 50:
        raise ImproperlyConfigured("SECRET_KEY must be at least 50 characters in production.")
else:
    # A development key that is random per checkout, never a constant in the repository.
    _key_file = BASE_DIR / ".secret_key"
    if "SECRET_KEY" in os.environ:
        SECRET_KEY = os.environ["SECRET_KEY"]
    else:
        if not _key_file.exists():
            _key_file.write_text(secrets.token_urlsafe(64))
            _key_file.chmod(0o600)
        SECRET_KEY = _key_file.read_text().strip()

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "" if PRODUCTION else "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "channels",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    # The product, as a map: health board, registry, broker-neutral DLQ triage, audit, alerts.
    "dashboard",
    "channels_registry",
    "dlq",
    "audit",
    "alerts",
    "config",  # the wiring, last: it starts the in-process scheduler once the apps are ready
]

MIDDLEWARE = [
    # First: REMOTE_ADDR and the forwarded scheme as the trusted proxies say (dashboard/proxy.py).
    "dashboard.proxy.TrustedProxyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "dashboard.middleware.SecurityHeadersMiddleware",
    "dashboard.middleware.RejectNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        # Django's engine, printing every variable through ``visible`` (dashboard.templating);
        # named "django" so template_partials wraps its loaders.
        "BACKEND": "dashboard.templating.DjangoTemplates",
        "NAME": "django",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            # {% partialdef %} everywhere: pages and their htmx/websocket partials are one file.
            "builtins": [
                "template_partials.templatetags.partials",
                # ``|visible``: user- and broker-supplied text with direction overrides and
                # control characters shown as markers, on every page.
                "dlq.templatetags.dlq_text",
            ],
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
    )
}
if PRODUCTION and DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured("Production needs PostgreSQL: set DATABASE_URL=postgres://…")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A busy SQLite file waits for its writer instead of failing at once.
    # IMMEDIATE: every transaction takes the write lock when it starts, so concurrent writers
    # queue instead of failing half-way (the audit chain relies on one writer at a time).
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # A file, not shared-cache memory, so threads in tests queue on the lock like production.
    DATABASES["default"]["TEST"] = {
        "NAME": os.environ.get("DLO_TEST_DB_NAME", str(BASE_DIR / "test-db.sqlite3"))
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"
# Failed logins per (username, IP) and per IP within the window before the form refuses.
# Reverse proxies whose X-Forwarded-For / X-Forwarded-Proto are believed (addresses or
# networks, comma-separated); none by default, so a client cannot choose its own address.
DLO_TRUSTED_PROXIES = env_list("DLO_TRUSTED_PROXIES", "")
DLO_TRUSTED_PROXIES_NETWORKS = parse_networks("DLO_TRUSTED_PROXIES", DLO_TRUSTED_PROXIES)

# API tokens: how long a new one lasts unless `apitoken create --days` says otherwise, and the
# most any may last.
DLO_API_TOKEN_DAYS = env_int("DLO_API_TOKEN_DAYS", 90)
DLO_API_TOKEN_MAX_DAYS = env_int("DLO_API_TOKEN_MAX_DAYS", 365)
if not 1 <= DLO_API_TOKEN_DAYS <= DLO_API_TOKEN_MAX_DAYS:
    raise ImproperlyConfigured(
        "DLO_API_TOKEN_DAYS must be at least 1 and at most DLO_API_TOKEN_MAX_DAYS."
    )

LOGIN_RATE_LIMIT = env_int("LOGIN_RATE_LIMIT", 5)
LOGIN_RATE_WINDOW_S = env_int("LOGIN_RATE_WINDOW_S", 300)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

# Outside production WhiteNoise serves straight from the app and project static folders.
WHITENOISE_USE_FINDERS = not PRODUCTION
WHITENOISE_AUTOREFRESH = not PRODUCTION

REDIS_URL = os.environ.get("REDIS_URL", "")
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

CHANNEL_LAYERS = {
    "default": (
        {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 times sockets out after 5 s by default, which kills channels_redis's
            # blocking receive and every idle websocket with it (channels_redis #422).
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
                "capacity": 1000,
                "expiry": 30,
            },
        }
        if REDIS_URL
        else {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}
    )
}

# Celery: JSON only. Without a broker URL, tasks run eagerly in-process (make run, tests).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "")
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 600
CELERY_TASK_SOFT_TIME_LIMIT = 540
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = beat_schedule()

# The in-process scheduler (make run) drives the same periodic functions as Celery beat.
DLO_INPROCESS_SCHEDULER = env_bool("DLO_INPROCESS_SCHEDULER", False)
# Timeout, in seconds, of every call to a broker.
DLO_BROKER_TIMEOUT_S = float(env_int("DLO_BROKER_TIMEOUT_S", 5))
# This dashboard's id on shared brokers (NATS drain consumer names); empty: one stored in the DB.
DLO_INSTALLATION_ID = env_str("DLO_INSTALLATION_ID", "")
# NATS drain consumers: how long a fetched, unacknowledged advisory stays invisible (the wait
# after an ingester crash) and how many may be outstanding at once.
DLO_NATS_DRAIN_ACK_WAIT_S = env_int("DLO_NATS_DRAIN_ACK_WAIT_S", 30)
DLO_NATS_DRAIN_MAX_ACK_PENDING = env_int("DLO_NATS_DRAIN_MAX_ACK_PENDING", 20_000)
# A Broker declaration takes its URL only from a variable named DLO_BROKER_… or listed here:
# never from SECRET_KEY, DATABASE_URL or anything else of this server's environment.
DLO_BROKER_URL_ENV_ALLOW = env_list("DLO_BROKER_URL_ENV_ALLOW", "")
# A broker's credentials go to its own host only, unless another host is listed here (the
# management API or metrics endpoint of another node of the cluster).
DLO_BROKER_CREDENTIAL_HOSTS = env_list("DLO_BROKER_CREDENTIAL_HOSTS", "")
# Brokers polled at the same time (threads per poll cycle), so a hung one delays no other.
DLO_POLL_CONCURRENCY = env_int("DLO_POLL_CONCURRENCY", 8)
# Health (docs/health.md): seconds without progress before STALLED / STOPPED (also how long a
# consumer may stay silent and still count as attached), and the trend window.
DLO_HEALTH_STALL_S = env_int("DLO_HEALTH_STALL_S", 60)
DLO_HEALTH_WINDOW_S = env_int("DLO_HEALTH_WINDOW_S", 600)
# Ids per dead-letter partition (PostgreSQL, ``dlq.capture.partitions``): each holds that many
# entries' worth of ingest time; retention drops a partition once all of it is past policy.
DLO_DLQ_PARTITION_SIZE = env_int("DLO_DLQ_PARTITION_SIZE", 1_000_000)
# Raw poll samples are kept this long; 1-minute rollups (for charts) this many days.
DLO_SAMPLE_RETENTION_HOURS = env_int("DLO_SAMPLE_RETENTION_HOURS", 48)
DLO_ROLLUP_RETENTION_DAYS = env_int("DLO_ROLLUP_RETENTION_DAYS", 30)
# System actor recorded on audit events made by commands without a user.
DLO_SYSTEM_ACTOR = env_str("DLO_SYSTEM_ACTOR", "system")
# The audit log (docs/audit.md): who seals events (thread | inline | off), the Ed25519 key that
# signs checkpoints (a file path; never stored in the database), where checkpoints go, and the
# older public keys ``audit verify`` also trusts (paths separated by ``os.pathsep``).
DLO_AUDIT_SEALER = env_str("DLO_AUDIT_SEALER", "thread")
DLO_AUDIT_SIGNING_KEY = env_str("DLO_AUDIT_SIGNING_KEY", "")
DLO_AUDIT_CHECKPOINT_DIR = env_str("DLO_AUDIT_CHECKPOINT_DIR", "")
DLO_AUDIT_PUBLIC_KEYS = env_str("DLO_AUDIT_PUBLIC_KEYS", "")
DLO_AUDIT_CHECKPOINT_WEBHOOK = env_str("DLO_AUDIT_CHECKPOINT_WEBHOOK", "")
# The key file of the MAC every event carries (audit/mac.py): made by the application, never
# stored in the database, so a database superuser cannot add an event the sealer accepts.
# Development creates it on first use; production must name an existing file (``firstrun``).
DLO_AUDIT_MAC_KEY = env_str(
    "DLO_AUDIT_MAC_KEY", "" if PRODUCTION else str(BASE_DIR / ".audit" / "mac.key")
)
# A checkpoint at most this many seconds after the log grew (the window in which a rewrite of
# the newest events is not yet anchored; docs/audit.md). Read by config/periodic.py too.
DLO_AUDIT_CHECKPOINT_INTERVAL_S = env_int("DLO_AUDIT_CHECKPOINT_INTERVAL_S", 10)
if DLO_AUDIT_CHECKPOINT_INTERVAL_S < 1:
    raise ImproperlyConfigured("DLO_AUDIT_CHECKPOINT_INTERVAL_S must be at least 1 second.")
# In seq order an event's created_at may be earlier than its predecessor's by at most this
# much (clock skew between hosts, a commit that waited): more is a forged or misdated event.
DLO_AUDIT_CLOCK_TOLERANCE_S = env_int("DLO_AUDIT_CLOCK_TOLERANCE_S", 300)
if PRODUCTION:
    # Without these a production audit trail has no anchor outside the database and no
    # authentication of who wrote a row: refuse to start rather than run unanchored.
    for _name in ("DLO_AUDIT_SIGNING_KEY", "DLO_AUDIT_CHECKPOINT_DIR", "DLO_AUDIT_MAC_KEY"):
        if not globals()[_name]:
            raise ImproperlyConfigured(
                f"Production needs {_name} (docs/audit.md: the audit trail's keys and "
                "checkpoint directory, outside the database; docker-compose.yml mounts them)."
            )
# How long an event may stay unsealed, or the log go without a checkpoint, before the audit
# page, /metrics and the alert say so.
DLO_AUDIT_UNSEALED_WARN_S = env_int("DLO_AUDIT_UNSEALED_WARN_S", 30)
# Bulk actions above this many entries need a second person's approval.
DLO_FOUR_EYES_THRESHOLD = env_int("DLO_FOUR_EYES_THRESHOLD", 1000)
# …counting everything one person asked for (per action kind) within this many seconds, so
# splitting a large action into plans under the threshold still needs the second person.
DLO_FOUR_EYES_WINDOW_S = env_int("DLO_FOUR_EYES_WINDOW_S", 3600)
# Freezing a plan (dlq/plans/freeze.py): selections up to DLO_FREEZE_INLINE entries are frozen in
# the request; larger ones in the background, DLO_FREEZE_CHUNK entries per short transaction.
DLO_FREEZE_INLINE = env_int("DLO_FREEZE_INLINE", 1000)
DLO_FREEZE_CHUNK = env_int("DLO_FREEZE_CHUNK", 10000)
# Alerting: /metrics without a token only from these networks; notifications of one broker
# within this many seconds go out as one message; links in notifications start with this URL.
METRICS_ALLOWED_NETWORKS = env_list("METRICS_ALLOWED_NETWORKS", "127.0.0.1/32,::1/128")
DLO_ALERT_GROUP_WAIT_S = env_int("DLO_ALERT_GROUP_WAIT_S", 30)
DLO_BASE_URL = env_str("DLO_BASE_URL", "")
# Webhooks reach public addresses only; these networks (CIDR) or host names are allowed too,
# e.g. an internal chat relay. Loopback, link-local (cloud metadata) and private otherwise fail.
DLO_WEBHOOK_ALLOW = env_list("DLO_WEBHOOK_ALLOW", "")
# Request bodies over this many bytes are refused (413) before any buffering, authenticated or
# not (see dashboard/body_limit.py).
DLO_MAX_REQUEST_BYTES = env_int("DLO_MAX_REQUEST_BYTES", 5 * 1024 * 1024)

# The JSON API (/api/): bearer tokens for scripts, the session (with CSRF) for the browser;
# JSON in and out only (no browsable API: its pages need inline script the CSP forbids).
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "dashboard.api.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON only, its nesting bounded before parsing (a deep body was a RecursionError, a 500).
    "DEFAULT_PARSER_CLASSES": ["dashboard.api.BoundedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "dashboard.api.api_exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Dead Letter Office API",
    "DESCRIPTION": (
        "Dead letters, replay/discard plans and the audit trail. Authenticate with "
        "`Authorization: Bearer <token>` (`manage.py apitoken create USER NAME`), or with the "
        "browser session plus the CSRF token for writes."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SERVE_AUTHENTICATION": [
        "dashboard.api.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "SCHEMA_PATH_PREFIX": "/api/",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "dashboard.api.add_error_responses",
        "dlq.plans.plan_api.plan_request_schema",
        "dashboard.api.refuse_nul_in_request_strings",
    ],
    # Swagger UI from the sidecar package (served by WhiteNoise), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Security headers. The CSP allows no inline or eval'd script; styles may be inline for the
# Django admin's own markup only.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; "
    "base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the hx-headers attribute, not JS.
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # One line per broker HTTP call drowns the summaries of poll and ingest.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        "pika": {"level": "WARNING"},
        # stomp.py logs every connection it opens (ActiveMQ: one per poll, drain, publisher).
        "stomp.py": {"level": "WARNING"},
    },
}
