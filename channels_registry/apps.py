from __future__ import annotations

from django.apps import AppConfig


class ChannelsRegistryConfig(AppConfig):
    name = "channels_registry"
    verbose_name = "Channel registry"
