"""The broker adapter for a channel, as ingest and the relay both open it.

Below ``dlq.ingest`` and ``dlq.relay_publish`` (which each call ``adapters.adapter_for`` through
this module, so a test that swaps ``adapter_for`` here swaps it for both).
"""

from __future__ import annotations

from django.conf import settings

from brokers import get_adapter
from brokers.base import BrokerAdapter
from brokers.nats_jetstream import NatsJetStreamAdapter
from channels_registry.models import Channel, installation_id


def adapter_for(channel: Channel) -> BrokerAdapter:
    broker = channel.broker
    adapter = get_adapter(broker.kind, broker.connection_url(), **broker.adapter_options())
    adapter.installation_id = installation_id()
    if isinstance(adapter, NatsJetStreamAdapter):
        adapter.drain_ack_wait_s = float(settings.DLO_NATS_DRAIN_ACK_WAIT_S)
        adapter.drain_max_ack_pending = int(settings.DLO_NATS_DRAIN_MAX_ACK_PENDING)
    return adapter
