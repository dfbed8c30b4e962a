"""What a broker's poller cannot see, said on the channel page with the fix.

RabbitMQ without its management API (not configured, or ``make demo`` found it unreachable and
declared the broker without it) is polled by AMQP passive declares: the ready count and the
consumer count only. With an API configured that stopped answering, the poll fails and the
numbers go stale. Either way the page says so, not only the demo's console.
"""

from __future__ import annotations

import dataclasses

from channels_registry.models import Broker, BrokerKind, BrokerPollState

PLUGIN_FIX = "rabbitmq-plugins enable rabbitmq_management"


@dataclasses.dataclass(frozen=True)
class Note:
    problem: str
    fix: str


def management_notes(broker: Broker) -> list[Note]:
    if broker.kind != BrokerKind.RABBITMQ:
        return []
    if not broker.management_url:
        return [
            Note(
                "Polled over AMQP only: RabbitMQ's management API is not configured for this "
                "broker (make demo leaves it out when the API was unreachable), so consumer "
                "utilisation, rates, in-flight counts and message ages are unknown here.",
                f"Enable the plugin ({PLUGIN_FIX}), then set the broker's management URL "
                "(e.g. http://127.0.0.1:15672/) in the registry admin, or run make demo again.",
            )
        ]
    state = BrokerPollState.objects.filter(broker=broker).first()
    if (
        state is not None
        and state.last_error_at is not None
        and (state.last_success_at is None or state.last_error_at > state.last_success_at)
    ):
        return [
            Note(
                f"RabbitMQ's management API at {broker.management_url} was unreachable on the "
                f"last poll ({state.last_error[:300]}): the numbers below are from the last "
                "poll that worked.",
                f"Check that the management plugin is enabled ({PLUGIN_FIX}) and that the "
                "dashboard reaches the URL (curl it with /api/overview appended); fix the URL "
                "in the registry admin if it moved.",
            )
        ]
    return []
