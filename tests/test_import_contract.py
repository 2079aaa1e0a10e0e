"""The import contract: which part of Cadence may import which, checked on the source.

Dependencies point one way: the scheduler is a pure library, `common` holds facts and
helpers everything may use, the worker and trainer know nothing of the operator, the
simulator runs no engine, only the command line (the composition root) and the benches
may import everything, and the kopf operator's process never loads torch. Every import
counts, at module level or inside a function, because a lazy import is still a
dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
# Source folder -> the package it installs as (pyproject.toml, package-dir).
FOLDERS = {
    "operator": "cadence.operator",
    "worker": "cadence.worker",
    "trainer": "cadence.trainer",
    "sim": "cadence.sim",
    "bench": "cadence.bench",
    "cli": "cadence.cli",
    "common": "cadence.common",
    "devcluster": "cadence.devcluster",
}
ENGINES = ("torch", "vllm", "transformers", "safetensors")


@dataclass(frozen=True)
class Rule:
    """Modules under `package` may import only the project modules under `allowed`
    (their own package always), and none of the third-party top-level `banned`."""

    package: str
    allowed: tuple[str, ...]
    banned: tuple[str, ...] = ()
    why: str = ""


RULES = (
    Rule(
        "cadence.operator.scheduler",
        (),
        (*ENGINES, "httpx", "fastapi", "kopf", "yaml"),
        why="the scheduler is a pure function of its snapshot: no I/O, no project imports",
    ),
    Rule("cadence.common", (), ("torch", "vllm"), why="shared facts and helpers depend on nothing"),
    Rule(
        "cadence.worker",
        ("cadence.common",),
        why="a worker knows nothing of the operator, the trainer or the simulator",
    ),
    Rule(
        "cadence.trainer",
        ("cadence.common", "cadence.worker.api"),
        why="the trainer knows workers only by their wire types",
    ),
    Rule(
        "cadence.sim",
        ("cadence.common", "cadence.operator.scheduler"),
        ENGINES,
        why="the simulator runs the scheduler on modelled accelerators, never an engine",
    ),
    Rule(
        "cadence.operator",
        (
            "cadence.operator",
            "cadence.common",
            "cadence.sim",
            "cadence.worker",
            "cadence.trainer",
        ),
        why="the operator never imports the command line or the benches",
    ),
    Rule(
        "cadence.devcluster",
        ("cadence.operator", "cadence.common"),
        why="the development cluster runs the operator; the operator never imports it",
    ),
)


def module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([FOLDERS[parts[0]], *parts[1:]])


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, absolute, wherever in the file the import is (a name
    imported from a module counts as that module unless it is a submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_of(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            # `from cadence.worker import api` imports the module cadence.worker.api.
            out.update(
                f"{target}.{alias.name}"
                for alias in node.names
                if _is_module(f"{target}.{alias.name}")
            )
    return out


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(rule: Rule, files: list[Path]) -> list[str]:
    out = []
    for path in files:
        if not _within(module_of(path), rule.package):
            continue
        for target in sorted(imports_of(path)):
            if _within(target, "cadence"):
                allowed = any(_within(target, a) for a in (rule.package, *rule.allowed))
            else:
                allowed = target.split(".")[0] not in rule.banned
            if not allowed:
                out.append(f"{path.relative_to(ROOT)} imports {target}")
    return out


def _is_module(name: str) -> bool:
    """Whether `name` is a module or package of the project's source folders."""
    parts = name.split(".")
    folder = {v: k for k, v in FOLDERS.items()}
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head in folder:
            rest = parts[i:]
            base = ROOT / folder[head] / Path(*rest) if rest else ROOT / folder[head]
            return base.with_suffix(".py").exists() or (base / "__init__.py").exists()
    return False


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.package)
def test_imports_point_one_way(rule: Rule) -> None:
    found = violations(rule, sources())
    assert not found, f"{rule.why}:\n" + "\n".join(found)


def test_the_contract_sees_a_forbidden_import(tmp_path: Path) -> None:
    """A rule must be able to fail: a scheduler module importing the simulator does."""
    probe = ROOT / "operator" / "scheduler" / "_contract_probe.py"
    probe.write_text("from cadence.sim.core import Simulation\n", encoding="utf-8")
    try:
        found = violations(RULES[0], [probe])
    finally:
        probe.unlink()
    assert found == ["operator/scheduler/_contract_probe.py imports cadence.sim.core"]


def test_the_kopf_operator_never_loads_torch() -> None:
    """`cadence operator` imports its handlers and the control loop, not the trainer's
    torch (about 20 s of start-up on a small pod, and memory it never uses)."""
    probe = (
        "import sys, cadence.operator.kube.serve, cadence.operator.kube.handlers;"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT.parent, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
