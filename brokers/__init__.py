"""Broker adapters: one module per broker behind ``brokers.base.BrokerAdapter``.

No Django imports anywhere in this package. ``get_adapter`` builds an adapter from a kind name
using the registry of dotted paths below, so adding a broker is one module and one line here.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from brokers.base import BrokerAdapter, BrokerError

ADAPTERS: dict[str, str] = {
    "rabbitmq": "brokers.rabbitmq.RabbitMQAdapter",
    "redis": "brokers.redis_streams.RedisStreamsAdapter",
    "nats": "brokers.nats_jetstream.NatsJetStreamAdapter",
    "activemq": "brokers.activemq.ActiveMQAdapter",
}


def get_adapter(kind: str, url: str, **options: Any) -> BrokerAdapter:
    """Build the adapter for ``kind``; raise a permanent ``BrokerError`` for an unknown kind."""
    try:
        dotted = ADAPTERS[kind]
    except KeyError:
        raise BrokerError(f"unknown broker kind {kind!r}", permanent=True) from None
    module_name, class_name = dotted.rsplit(".", 1)
    adapter_class: type[BrokerAdapter] = getattr(import_module(module_name), class_name)
    return adapter_class(url, **options)
