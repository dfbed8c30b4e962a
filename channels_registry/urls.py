from __future__ import annotations

from django.urls import path

from channels_registry import import_views, views

urlpatterns = [
    path("", views.channel_list, name="channel_list"),
    path("import/", import_views.registry_import, name="registry_import"),
    path("principles/", views.principles, name="principles"),
    path("<slug:slug>/", views.channel_detail, name="channel_detail"),
    path("<slug:slug>/retries/", views.channel_retries, name="channel_retries"),
]
