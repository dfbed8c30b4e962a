"""The layers as a contract (issue 25): imports point one way, and no new cycle appears.

The import graph is read from the source with ``ast``, so imports inside functions (and under
``TYPE_CHECKING``) count: a cycle hidden in a function body is still a cycle. Migrations are
left out (``tests/test_migrations_frozen.py`` checks them), and so are tests and benchmarks.

The rules, bottom to top:

1. ``brokers`` imports no project code.
2. The web helpers of ``dashboard`` (``WEB``: HTTP, HTML, text, proxy, egress, API tokens,
   roles) import no app.
3. Apps import only their own layer or lower ones: ``brokers`` < ``audit`` <
   ``channels_registry`` < ``dlq`` < ``alerts`` < ``dashboard`` (its pages and the board) <
   ``config`` (the wiring).
4. No import cycle among project modules.

Today's known violations are listed below (``UPWARD`` and ``KNOWN_CYCLES``), each with its
reason; they may shrink, never grow. A new upward import or a new (or larger) cycle fails.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("alerts", "audit", "brokers", "channels_registry", "config", "dashboard", "dlq")
SKIP_DIRS = {"migrations", "static", "templates", "__pycache__"}

#: The layers, bottom first. ``web`` is part of the ``dashboard`` package (``WEB``).
LAYERS = ["brokers", "web", "audit", "channels_registry", "dlq", "alerts", "dashboard", "config"]
WEB = {
    "dashboard.admin_text",
    "dashboard.api",
    "dashboard.egress",
    "dashboard.html",
    "dashboard.http",
    "dashboard.models",
    "dashboard.proxy",
    "dashboard.roles",
    "dashboard.templatetags",
    "dashboard.templatetags.dlo_time",
    "dashboard.text",
}

#: Known upward imports (importer, imported). Remove a line when its import goes; never add one
#: without a reason the review accepts.
UPWARD: set[tuple[str, str]] = set()

#: Known cycles (strongly connected components of more than one module). None is left (issue 25
#: broke the last two: the plan lifecycle and the live board's push); any cycle now fails.
KNOWN_CYCLES: list[frozenset[str]] = []

#: Cycles broken in issue 25; they must not come back in any form.
FIXED = {
    "alerts.evaluate",
    "alerts.models",
    "alerts.rules",
    "alerts.tasks",
    "audit.actions",
    "audit.checkpoints",
    "audit.history",
    "audit.recording",
    "audit.sealer",
    "audit.tasks",
    "audit.verify",
    "audit.witnessing",
    "channels_registry.polling",
    "dashboard.board.page",
    "dashboard.board.rows",
    "dashboard.board.live",
    "dlq.plans.actions",
    "dlq.plans.discard",
    "dlq.plans.freeze",
    "dlq.capture.ingest",
    "dlq.models",
    "dlq.plans.plan_jobs",
    "dlq.plans.plan_state",
    "dlq.plans.relay",
    "dlq.plans.relay_publish",
    "dlq.plans.relay_states",
    "dlq.tasks",
    "dlq.capture.trends",
}


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            rel = path.relative_to(root)
            if SKIP_DIRS & set(rel.parts[:-1]):
                continue
            name = ".".join(rel.with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → project modules it imports (anywhere in its body), resolved to the longest
    known module name (``from dlq import ingest`` is an import of ``dlq.ingest``)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = _package_of(name, path).split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def layer_of(module: str) -> str:
    if module in WEB:
        return "web"
    return module.split(".")[0]


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (importer, imported)
        for importer, targets in graph.items()
        for imported in targets
        if LAYERS.index(layer_of(imported)) > LAYERS.index(layer_of(importer))
    }


def _graph() -> dict[str, set[str]]:
    return import_graph(project_modules())


def test_no_new_import_cycle() -> None:
    new = [sorted(c) for c in cycles(_graph()) if not any(c <= known for known in KNOWN_CYCLES)]
    assert new == []


def test_broken_cycles_stay_broken() -> None:
    back = [sorted(c) for c in cycles(_graph()) if c & FIXED]
    assert back == []


def test_brokers_import_no_project_code() -> None:
    graph = _graph()
    offenders = sorted(
        (importer, imported)
        for importer, targets in graph.items()
        if importer.split(".")[0] == "brokers"
        for imported in targets
        if imported.split(".")[0] != "brokers"
    )
    assert offenders == []


def test_no_new_upward_import() -> None:
    assert sorted(upward_imports(_graph()) - UPWARD) == []


def test_the_allowlists_list_only_what_exists() -> None:
    """A fixed violation leaves its allowlist line behind otherwise, silently allowing it back."""
    graph = _graph()
    assert sorted(UPWARD - upward_imports(graph)) == []
    assert all(set(graph) >= known for known in KNOWN_CYCLES)
    assert set(graph) >= WEB


def test_the_checker_sees_imports_inside_functions_and_cycles(tmp_path: Path) -> None:
    (tmp_path / "dlq").mkdir()
    (tmp_path / "dlq" / "__init__.py").write_text("")
    (tmp_path / "dlq" / "a.py").write_text("from dlq import b\n")
    (tmp_path / "dlq" / "b.py").write_text("def f():\n    from .a import x\n")
    (tmp_path / "brokers").mkdir()
    (tmp_path / "brokers" / "base.py").write_text("def g():\n    import dashboard.board\n")
    (tmp_path / "dashboard").mkdir()
    (tmp_path / "dashboard" / "board.py").write_text("")
    graph = import_graph(project_modules(tmp_path))
    assert cycles(graph) == [frozenset({"dlq.a", "dlq.b"})]
    assert upward_imports(graph) == {("brokers.base", "dashboard.board")}


def test_import_linter_allows_the_same_upward_imports() -> None:
    """``lint-imports`` (pyproject.toml) and this module state one contract: the known upward
    imports it ignores are ``UPWARD``, no more."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}
    named = {
        tuple(line.split(" -> ")) for line in contracts["apps"]["ignore_imports"] if "*" not in line
    }
    assert named == UPWARD
    web = {line.split(" -> ")[1] for line in contracts["apps"]["ignore_imports"] if "**" in line}
    assert {w.removesuffix(".**") for w in web} <= WEB
    assert set(contracts["web"]["source_modules"]) <= WEB
