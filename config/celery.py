"""Celery application. JSON only: message bodies are never unpickled.

A worker settles its heap once it is ready (``config.startup.settle_process_heap``): in each
pool process of the default prefork pool as it starts, and in the worker's own process, where
the solo and threads pools run their tasks."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init, worker_ready

from config.startup import settle_process_heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("dashboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
worker_process_init.connect(settle_process_heap, weak=False)
worker_ready.connect(settle_process_heap, weak=False)
