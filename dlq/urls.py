from __future__ import annotations

from django.urls import path

from dlq import views

app_name = "dlq"
urlpatterns = [
    path("", views.group_list, name="group_list"),
    path("list/", views.entry_list, name="entry_list"),
    path("<int:pk>/", views.entry_detail, name="entry_detail"),
    path("<int:pk>/reveal/", views.entry_reveal, name="entry_reveal"),
    path("<int:pk>/raw/", views.entry_download, name="entry_download"),
]
