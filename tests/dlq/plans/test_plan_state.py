"""One owner for a plan's status (issue 25): ``dlq.plans.plan_state`` alone writes
``ReplayPlan.status``; everything else asks it. Read from the source with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OWNER = ROOT / "dlq" / "plans" / "plan_state.py"
PACKAGES = ("alerts", "audit", "brokers", "channels_registry", "dashboard", "dlq")


def _sources() -> list[Path]:
    return [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts and path != OWNER
    ]


def _chain_names(node: ast.AST) -> set[str]:
    """Every name and attribute along a call chain (``ReplayPlan.objects.filter(…).update``)."""
    names: set[str] = set()
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            names.add(node.id)
            return names
        else:
            return names


def _writes_status(call: ast.Call) -> bool:
    keywords = {k.arg for k in call.keywords}
    if "status" in keywords:
        return True
    return any(  # .update(**{"status": …})
        k.arg is None
        and isinstance(k.value, ast.Dict)
        and any(isinstance(key, ast.Constant) and key.value == "status" for key in k.value.keys)
        for k in call.keywords
    )


def status_writes(path: Path) -> list[str]:
    """``<plan>.status = …`` and ``ReplayPlan…update(status=…)`` in ``path``."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr == "status"
                and "plan" in ast.unparse(target.value).lower()
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(target)} =")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"update", "update_or_create", "bulk_update"}
            and {"ReplayPlan", "plans"} & _chain_names(node.func.value)
            and _writes_status(node)
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}(…)")
    return found


def test_only_plan_state_writes_a_plans_status() -> None:
    assert [hit for path in _sources() for hit in status_writes(path)] == []


def test_plan_state_is_the_writer() -> None:
    """The check above sees the writes it forbids: they are all in the owner."""
    assert len(status_writes(OWNER)) >= 10


def test_one_start_plan() -> None:
    defined = [
        str(path.relative_to(ROOT))
        for path in [*_sources(), OWNER]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef) and node.name == "start_plan"
    ]
    assert defined == ["dlq/plans/plan_state.py"]


def test_the_check_sees_both_forms(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text(
        "plan.status = 'running'\n"
        "ReplayPlan.objects.filter(pk=1).update(status='done')\n"
        "ReplayPlan.objects.filter(pk=1).update(**{'status': 'done'})\n"
        "item.status = 'sent'\n"
        "ReplayItem.objects.update(status='sent')\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(status_writes(sample)) == 3
    finally:
        ROOT = saved
