"""Declarations as code: export the registry to YAML and import it back.

The import validates every item with the same forms as the admin, runs the same declaration
checks, records the same audit events, and happens in one transaction: either every item is
applied or none is. Errors name the file line of the offending key.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import yaml
from django import forms
from django.db import transaction
from django.forms import ModelForm

from audit.actions import Actor
from channels_registry.actions import do_save_broker, do_save_channel, refresh_findings
from channels_registry.checks import ERROR
from channels_registry.forms import CHANNEL_FORM_FIELDS, BrokerForm, ChannelForm
from channels_registry.models import Broker, Channel

FORMAT_VERSION = 1
BROKER_FIELDS = ["name", "kind", "url_env", "management_url", "enabled", "poll_interval_s"]
CHANNEL_FIELDS = [name for name in CHANNEL_FORM_FIELDS if name != "broker"]


@dataclasses.dataclass
class ImportProblem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclasses.dataclass
class ImportReport:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    problems: list[ImportProblem] = dataclasses.field(default_factory=list)
    findings: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)

    @property
    def error_findings(self) -> int:
        return sum(1 for fs in self.findings.values() for f in fs if f["severity"] == ERROR)


class DeclarationFileError(Exception):
    def __init__(self, problems: list[ImportProblem]) -> None:
        super().__init__("; ".join(map(str, problems)))
        self.problems = problems


def export_registry() -> str:
    """The whole registry as YAML. Stored secrets are never written out."""
    brokers = []
    for broker in Broker.objects.order_by("name"):
        item: dict[str, Any] = {name: getattr(broker, name) for name in BROKER_FIELDS}
        if broker.url_secret and not broker.url_env:
            item["# note"] = "connection URL is stored as a secret in the dashboard; not exported"
        brokers.append(item)
    channels = []
    for channel in Channel.objects.select_related("broker").order_by("slug"):
        data: dict[str, Any] = {"slug": channel.slug, "name": channel.name}
        data["broker"] = channel.broker.name
        for name in CHANNEL_FIELDS:
            if name not in data:
                data[name] = getattr(channel, name)
        channels.append(data)
    document = {"version": FORMAT_VERSION, "brokers": brokers, "channels": channels}
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _key_lines(node: yaml.MappingNode) -> dict[str, int]:
    return {str(key.value): _line(key) for key, _ in node.value}


# Bounds checked before anything is built from the file (issue #12: a 1 KB alias bomb took
# 2.8 GB; 5,000 nested brackets overflowed the parser's recursion). A real declaration file
# is a few levels deep, uses no aliases, and has a few dozen nodes per channel.
MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_DEPTH = 32
MAX_ALIASES = 100
MAX_NODES = 500_000


class _TooBig(yaml.YAMLError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, refusing documents nested deeper than ``MAX_DEPTH`` or with more
    than ``MAX_ALIASES`` aliases while it composes them (the composer recurses per level)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        line = self.peek_event().start_mark.line + 1
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _TooBig(line, f"more than {MAX_ALIASES} YAML aliases; write values out")
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooBig(line, f"nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the document has once every alias is expanded, without expanding it:
    each node's size is computed once (aliases share nodes). Stops past ``MAX_NODES``; a
    node that contains itself (``&a [*a]``) counts as unbounded."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in in_progress:
            return MAX_NODES + 1
        in_progress.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_NODES:
                break
        in_progress.discard(key)
        sizes[key] = total
        return total

    return size(root)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unstorable_scalar(root: yaml.Node) -> tuple[int, str] | None:
    """The line and a description of the first scalar the database cannot store: a NUL
    (YAML's ``"\\0"`` escape; PostgreSQL text refuses it, a DataError) or a lone surrogate
    (``"\\ud800"``; not encodable as UTF-8). Each node once, so aliases cost nothing."""
    seen: set[int] = set()
    stack: list[yaml.Node] = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            value = str(node.value)
            if "\x00" in value:
                return _line(node), "a NUL character (\\0) in a value; remove it"
            if _SURROGATE.search(value):
                return _line(node), "a lone surrogate (\\ud800-\\udfff) in a value; remove it"
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(part for pair in node.value for part in pair)
    return None


def _parse(text: str) -> tuple[dict[str, Any], yaml.MappingNode]:
    """The document and its node tree, within the bounds above.

    1. Refuse a file over ``MAX_FILE_BYTES``.
    2. Compose the node tree with the bounded loader (depth, alias count).
    3. Refuse a tree that would expand past ``MAX_NODES`` or contains itself.
    4. Refuse a value the database cannot store (NUL, lone surrogates), naming its line.
    5. Only then construct Python values, from that same tree.
    """
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise DeclarationFileError(
            [ImportProblem(1, f"the file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")]
        )
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is not None and _expanded_size(root) > MAX_NODES:
            raise _TooBig(
                1, f"the aliases expand to more than {MAX_NODES:,} values; write values out"
            )
        unstorable = _unstorable_scalar(root) if root is not None else None
        if unstorable is not None:
            raise _TooBig(*unstorable)
        data = loader.construct_document(root) if root is not None else None
    except _TooBig as exc:
        raise DeclarationFileError([ImportProblem(exc.line, exc.message)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise DeclarationFileError(
            [ImportProblem(line, f"not valid YAML: {exc.problem or exc}")]
        ) from None
    except yaml.YAMLError as exc:
        raise DeclarationFileError([ImportProblem(1, f"not valid YAML: {exc}")]) from None
    finally:
        loader.dispose()
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise DeclarationFileError(
            [ImportProblem(1, "the file must be a mapping with 'brokers' and 'channels' lists")]
        )
    return data, root


def _section(root: yaml.MappingNode, name: str) -> list[yaml.MappingNode]:
    """The items of a top-level list, each required to be a mapping."""
    for key, value in root.value:
        if key.value != name:
            continue
        if isinstance(value, yaml.ScalarNode) and value.value in ("", "~", "null"):
            return []
        if not isinstance(value, yaml.SequenceNode):
            raise DeclarationFileError([ImportProblem(_line(key), f"'{name}' must be a list")])
        bad = [item for item in value.value if not isinstance(item, yaml.MappingNode)]
        if bad:
            raise DeclarationFileError(
                [
                    ImportProblem(_line(item), f"each item of '{name}' must be a mapping of fields")
                    for item in bad
                ]
            )
        return list(value.value)
    return []


def _form_data(model: type[Any], fields: list[str], item: dict[str, Any]) -> dict[str, Any]:
    """Model defaults overlaid with the item: the file is the whole truth for an item, so a
    key left out means its default, and importing the same file twice changes nothing."""
    data: dict[str, Any] = {}
    for name in fields:
        field = model._meta.get_field(name)
        default = field.get_default()
        data[name] = item.get(name, default)
        if data[name] is None:
            data[name] = ""
    return data


def _form_problems(
    form: ModelForm[Any], lines: dict[str, int], line: int, label: str
) -> list[ImportProblem]:
    problems = []
    for field, errors in form.errors.as_data().items():
        where = lines.get(field, line)
        prefix = f"{label}: {field}" if field != "__all__" else label
        for error in errors:
            text = " ".join(error.messages)
            if error.code in ("invalid_choice", "invalid_list"):
                text += _valid_values(form, field)
            problems.append(ImportProblem(where, f"{prefix}: {text}"))
    return problems


def _valid_values(form: ModelForm[Any], field: str) -> str:
    """ " Valid values: a, b, c." for a field with fixed choices (not a model lookup)."""
    form_field = form.fields.get(field)
    if form_field is None or isinstance(form_field, forms.ModelChoiceField):
        return ""
    values = [str(v) for v, _ in getattr(form_field, "choices", []) if v not in ("", None)]
    return f" Valid values: {', '.join(values)}." if values else ""


def _unknown_keys(
    item: dict[str, Any], allowed: set[str], lines: dict[str, int], line: int, label: str
) -> list[ImportProblem]:
    problems = []
    for key in item:
        if str(key).startswith("#"):
            continue
        if key == "url_secret":
            problems.append(
                ImportProblem(
                    lines.get(key, line),
                    f"{label}: url_secret is not "
                    "accepted in files; name an environment variable in "
                    "url_env instead",
                )
            )
        elif key not in allowed:
            problems.append(
                ImportProblem(
                    lines.get(str(key), line),
                    f"{label}: unknown field '{key}' (allowed: {', '.join(sorted(allowed))})",
                )
            )
    return problems


def import_registry(text: str, *, actor: Actor, check_only: bool = False) -> ImportReport:
    """Validate and upsert every broker and channel of ``text`` in one transaction.

    1. Parse, keeping each key's line for messages.
    2. Upsert brokers by name, then channels by slug, each through its admin form and the
       audited save action (unchanged items are skipped, so a re-import writes nothing).
    3. Any problem → roll everything back and raise ``DeclarationFileError`` with all problems.
       ``check_only`` always rolls back, after collecting the findings.
    """
    data, root = _parse(text)
    report = ImportReport()
    problems: list[ImportProblem] = []
    version = data.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        problems.append(
            ImportProblem(
                _key_lines(root).get("version", 1), f"unsupported version {version!r} (expected 1)"
            )
        )
    unknown_top = set(data) - {"version", "brokers", "channels"}
    for key in sorted(map(str, unknown_top)):
        problems.append(ImportProblem(_key_lines(root).get(key, 1), f"unknown section '{key}'"))
    if problems:
        raise DeclarationFileError(problems)

    with transaction.atomic():
        seen_brokers: set[str] = set()
        broker_items = data.get("brokers") or []
        for item, node in zip(broker_items, _section(root, "brokers"), strict=False):
            problems += _import_broker(item, node, seen_brokers, report, actor)
        seen_slugs: set[str] = set()
        channel_items = data.get("channels") or []
        for item, node in zip(channel_items, _section(root, "channels"), strict=False):
            problems += _import_channel(item, node, seen_slugs, report, actor)
        if problems:
            transaction.set_rollback(True)
            raise DeclarationFileError(sorted(problems, key=lambda p: p.line))
        if check_only:
            transaction.set_rollback(True)
    return report


def _import_broker(
    item: dict[str, Any], node: Any, seen: set[str], report: ImportReport, actor: Actor
) -> list[ImportProblem]:
    """Step 2 for one broker: its problems, or the audited upsert counted in ``report``."""
    lines, line = _key_lines(node), _line(node)
    name = str(item.get("name", ""))
    label = f"broker '{name}'" if name else "broker"
    problems = _unknown_keys(item, set(BROKER_FIELDS), lines, line, label)
    if name in seen:
        return [*problems, ImportProblem(lines.get("name", line), f"{label} is declared twice")]
    seen.add(name)
    existing = Broker.objects.filter(name=name).first() if name else None
    form = BrokerForm(data=_form_data(Broker, BROKER_FIELDS, item), instance=existing)
    if not form.is_valid():
        return problems + _form_problems(form, lines, line, label)
    before = Broker.objects.get(pk=existing.pk).audit_snapshot() if existing else None
    broker = form.save(commit=False)
    if before is not None and before == broker.audit_snapshot():
        report.unchanged += 1
        return problems
    do_save_broker(broker, actor=actor, before=before)
    report.created += before is None
    report.updated += before is not None
    return problems


def _import_channel(
    item: dict[str, Any], node: Any, seen: set[str], report: ImportReport, actor: Actor
) -> list[ImportProblem]:
    """Step 2 for one channel: its problems, or the audited upsert counted in ``report``
    (with the channel's contract findings)."""
    lines, line = _key_lines(node), _line(node)
    slug = str(item.get("slug", ""))
    label = f"channel '{slug}'" if slug else "channel"
    problems = _unknown_keys(item, {*CHANNEL_FIELDS, "broker"}, lines, line, label)
    if slug in seen:
        return [*problems, ImportProblem(lines.get("slug", line), f"{label} is declared twice")]
    seen.add(slug)
    broker_name = item.get("broker")
    broker_obj = Broker.objects.filter(name=broker_name).first() if broker_name else None
    if broker_obj is None:
        missing = (
            f"{label}: broker '{broker_name}' is not declared"
            if broker_name
            else (f"{label}: name its broker")
        )
        return [*problems, ImportProblem(lines.get("broker", line), missing)]
    existing = Channel.objects.filter(slug=slug).first() if slug else None
    form_data = _form_data(Channel, CHANNEL_FIELDS, item)
    form_data["broker"] = broker_obj.pk
    channel_form = ChannelForm(data=form_data, instance=existing)
    if not channel_form.is_valid():
        return problems + _form_problems(channel_form, lines, line, label)
    before = Channel.objects.get(pk=existing.pk).audit_snapshot() if existing else None
    channel = channel_form.save(commit=False)
    if before is not None and before == channel.audit_snapshot():
        refresh_findings(channel)
        report.findings[channel.slug] = channel.findings
        report.unchanged += 1
        return problems
    do_save_channel(channel, actor=actor, before=before)
    report.findings[channel.slug] = channel.findings
    report.created += before is None
    report.updated += before is not None
    return problems
