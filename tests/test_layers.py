"""The layers and import contracts of `pyproject.toml` ([tool.importlinter]) hold, can
fail, and keep the kopf operator's process free of torch.

import-linter checks every import, a function-level one included; the contracts are the
documentation of which part may import which (see docs/architecture.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

LINT = Path(sys.executable).with_name("lint-imports")


def lint(namespace: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the `cadence` namespace found under `namespace`."""
    env = {**os.environ, "PYTHONPATH": str(namespace)}
    return subprocess.run(
        [str(LINT), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=namespace,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_contract_is_kept() -> None:
    done = lint(ROOT / ".typecheck")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_scheduler_module_importing_the_simulator_breaks_three_contracts(tmp_path: Path) -> None:
    """A copy of the tree with one bad import (nothing is written into the checkout)."""
    tree = tmp_path / "cadence"
    tree.mkdir()
    for link in (ROOT / ".typecheck" / "cadence").iterdir():
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(link.resolve(), tree / link.name, ignore=ignore)
    bad = tree / "scheduler" / "probe.py"
    bad.write_text("from cadence.sim.core import Simulation\n", encoding="utf-8")
    done = lint(tmp_path)
    assert done.returncode == 1
    assert "cadence.scheduler is not allowed to import cadence.sim" in done.stdout
    assert "cadence.scheduler.probe -> cadence.sim.core" in done.stdout
    assert "- .scheduler -> .sim (1 import)" in done.stdout  # a cycle: sim imports scheduler
    assert "Contracts: 3 kept, 3 broken" in done.stdout


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
