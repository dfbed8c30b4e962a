from __future__ import annotations

from django.urls import path

from channels_registry import views

urlpatterns = [
    path("", views.channel_list, name="channel_list"),
    path("<slug:slug>/", views.channel_detail, name="channel_detail"),
]
