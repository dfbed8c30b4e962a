from __future__ import annotations

from django.urls import path

from alerts import views

app_name = "alerts"
urlpatterns = [
    path("", views.alert_list, name="alert_list"),
    path("badge/", views.badge, name="badge"),
    path("<int:pk>/", views.alert_detail, name="alert_detail"),
    path("<int:pk>/ack/", views.alert_ack, name="alert_ack"),
    path("silences/", views.silence_create, name="silence_create"),
    path("silences/<int:pk>/expire/", views.silence_expire, name="silence_expire"),
]
