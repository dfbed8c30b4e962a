"""The broker adapter for a channel, as ingest and the relay both open it.

Below ``dlq.capture.ingest`` and ``dlq.plans.relay_publish`` (which each call
``adapters.adapter_for`` through this module, so a test that swaps ``adapter_for`` here swaps it
for both).
"""

from __future__ import annotations

from brokers.base import BrokerAdapter
from channels_registry.models import Channel


def adapter_for(channel: Channel) -> BrokerAdapter:
    """The channel's broker's adapter (``Broker.adapter``, the one way to build one)."""
    return channel.broker.adapter()
