# The dashboard image: web (daphne, ASGI), Celery worker and beat all run from it.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DLO_ENV=production
WORKDIR /app
COPY requirements.lock pyproject.toml ./
RUN pip install --no-cache-dir --require-hashes -r requirements.lock
COPY . .
RUN SECRET_KEY=build-only-build-only-build-only-build-only-build-only \
    ALLOWED_HOSTS=localhost DATABASE_URL=postgres://build@localhost/build \
    DLO_AUDIT_SIGNING_KEY=/build DLO_AUDIT_MAC_KEY=/build DLO_AUDIT_CHECKPOINT_DIR=/build \
    python manage.py collectstatic --noinput
# The audit keys and checkpoints live in volumes outside the database's (docker-compose.yml);
# a new named volume takes these directories' owner, so the app user can write them.
RUN useradd --system --uid 10001 dlo && chown -R dlo /app/staticfiles \
    && mkdir -p /var/lib/dlo-keys /var/lib/dlo-checkpoints \
    && chown dlo /var/lib/dlo-keys /var/lib/dlo-checkpoints && chmod 700 /var/lib/dlo-keys
USER dlo
EXPOSE 8000
# No --proxy-headers: daphne would believe the left-most X-Forwarded-For from any client. The
# app reads forwarded headers itself, only from DLO_TRUSTED_PROXIES (dashboard/proxy.py).
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "config.asgi:application"]
