"""``/api/replay-plans/`` (the views live with the rest of the DLQ API in ``dlq.api``)."""

from __future__ import annotations

from dlq.api import plan_urlpatterns as urlpatterns

__all__ = ["urlpatterns"]
