"""Declarations as code in the browser: paste or upload a YAML file, check it, import it."""

from __future__ import annotations

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from audit.actions import Actor, do_record_denial
from channels_registry.declarations import (
    MAX_FILE_BYTES,
    DeclarationFileError,
    export_registry,
    import_registry,
)
from dashboard.http import HtmxHttpRequest


class ImportForm(forms.Form):
    file = forms.FileField(required=False, help_text="A YAML file from `registry export`.")
    text = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false"})
    )

    def clean(self) -> dict[str, object]:
        cleaned = super().clean() or {}
        upload = cleaned.get("file")
        if upload is not None:
            if upload.size > MAX_FILE_BYTES:
                raise forms.ValidationError("The file is larger than 2 MiB.")
            try:
                cleaned["text"] = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                raise forms.ValidationError("The file is not UTF-8 text.") from None
        if not cleaned.get("text"):
            raise forms.ValidationError("Upload a file or paste the YAML.")
        return cleaned


def _require_admin(request: HtmxHttpRequest) -> None:
    if not (
        request.user.has_perm("channels_registry.add_channel")
        and request.user.has_perm("channels_registry.change_channel")
    ):
        # Audited like every refused action: who tried to rewrite the registry, from where.
        do_record_denial(
            "registry.import",
            actor=Actor.from_request(request),
            target_type="channels_registry.registry",
            target_repr="registry declarations",
            details={
                "permission": "channels_registry.add_channel+change_channel",
                "method": request.method,
                "action": request.POST.get("action", "")[:20] if request.method == "POST" else "",
            },
        )
        raise PermissionDenied("Importing declarations needs the registry_admin role.")


@require_http_methods(["GET", "POST"])
def registry_import(request: HtmxHttpRequest) -> HttpResponse:
    """GET: the form. POST: ``action=check`` validates without writing; ``action=import``
    applies the file in one transaction, audited as the signed-in user."""
    _require_admin(request)
    context: dict[str, object] = {}
    if request.method == "POST":
        form = ImportForm(request.POST, request.FILES)
        check_only = request.POST.get("action") != "import"
        if form.is_valid():
            try:
                report = import_registry(
                    form.cleaned_data["text"],
                    actor=Actor.from_request(request),
                    check_only=check_only,
                )
                context.update(report=report, check_only=check_only)
            except DeclarationFileError as exc:
                context.update(problems=exc.problems)
    else:
        form = ImportForm(initial={"text": export_registry()})
    context["form"] = form
    return render(request, "channels_registry/import.html", context)
