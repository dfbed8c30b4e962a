"""The project's wiring: settings, URLs, the ASGI and Celery entry points, websocket routes,
the periodic jobs and the in-process scheduler of ``make run``. Nothing imports it but the
entry points (``manage.py``, daphne, celery) and its own app config."""

from __future__ import annotations

from config.celery import app as celery_app

__all__ = ["celery_app"]
