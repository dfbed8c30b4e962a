"""Messages waiting to retry, per channel (the broker's "Retry set"), read on demand.

One bounded adapter call (``BrokerAdapter.retries``) when the channel page asks for it, never
on the poll path: listing costs the broker more than a sample and nobody needs it every
poll. What the broker cannot show without consuming is unknown, with the reason (the
adapters' notes). Where the broker keeps no retry time (Redis), the next attempt is
estimated from the declared ack timeout and said to be an estimate.
"""

from __future__ import annotations

import dataclasses

from brokers.base import Address, BrokerError, RetryView, scrub
from channels_registry.models import BrokerConfigError, Channel

LIST_LIMIT = 50


@dataclasses.dataclass
class Retries:
    view: RetryView
    #: The earliest next attempt: the broker's, else an estimate (``estimated``).
    next_attempt_at: float | None = None
    estimated: bool = False
    error: str = ""  # the broker could not be read: everything is unknown


def read_retries(channel: Channel, limit: int = LIST_LIMIT) -> Retries:
    """The channel's messages waiting to retry, as its broker shows them (module docstring)."""
    broker = channel.broker
    url = ""
    try:
        url = broker.connection_url()
        adapter = broker.adapter()
        view = adapter.retries(
            Address(channel.address, channel.address_group), channel.retry_address, limit
        )
    except (BrokerConfigError, BrokerError) as exc:
        return Retries(RetryView(), error=scrub(str(exc), url))
    result = Retries(view, next_attempt_at=view.next_attempt_at)
    if view.messages and channel.ack_timeout_s and view.next_attempt_at is None:
        # Redis: claimed again once idle past the ack timeout (XAUTOCLAIM's min-idle-time).
        for message in view.messages:
            if message.next_attempt_at is None and message.last_delivered_at is not None:
                message.next_attempt_at = message.last_delivered_at + channel.ack_timeout_s
        times = [m.next_attempt_at for m in view.messages if m.next_attempt_at is not None]
        result.next_attempt_at, result.estimated = (min(times), True) if times else (None, False)
    return result
