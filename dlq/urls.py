from __future__ import annotations

from django.urls import path

from dlq.plans import replay_views
from dlq.triage import views

app_name = "dlq"
urlpatterns = [
    path("", views.group_list, name="group_list"),
    path("list/", views.entry_list, name="entry_list"),
    path("<int:pk>/", views.entry_detail, name="entry_detail"),
    path("<int:pk>/reveal/", views.entry_reveal, name="entry_reveal"),
    path("<int:pk>/raw/", views.entry_download, name="entry_download"),
    path("replay/", replay_views.bulk_action, {"kind": "replay"}, name="replay"),
    path("discard/", replay_views.bulk_action, {"kind": "discard"}, name="discard"),
    path("replays/awaiting/", replay_views.approvals_badge, name="approvals_badge"),
    path("replays/", replay_views.plan_list, name="plan_list"),
    path("replays/<int:pk>/", replay_views.plan_detail, name="plan_detail"),
    path("replays/<int:pk>/<slug:action>/", replay_views.plan_action, name="plan_action"),
]
