from __future__ import annotations

from django.urls import path

from audit import views

urlpatterns = [
    path("", views.event_list, name="audit_events"),
    path("export.csv", views.export, {"fmt": "csv"}, name="audit_export_csv"),
    path("export.jsonl", views.export, {"fmt": "jsonl"}, name="audit_export_jsonl"),
    path("export.proof.jsonl", views.export_proof, name="audit_export_proof"),
    path("verify/", views.verify_now, name="audit_verify"),
]
