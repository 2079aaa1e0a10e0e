"""The manual: its generated reference pages are current, it builds with no warning, the
README stays a front door, and nothing in the repository points outside it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cadence.cli import main
from cadence.cli.docs import pages
from tests.helpers import ROOT

REFERENCE = ROOT / "docs" / "reference"


def test_the_reference_pages_are_what_the_code_generates() -> None:
    for name, text in pages().items():
        assert (REFERENCE / name).read_text() == text, f"run: cadence docs ({name} is stale)"


def test_a_stale_page_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["docs", "--out", str(tmp_path)]) == 0
    page = tmp_path / "resources.md"
    page.write_text(page.read_text().replace("memoryGb", "memoryGiB"))
    assert main(["docs", "--out", str(tmp_path), "--check"]) == 1
    assert "resources.md" in capsys.readouterr().err


def test_every_field_of_the_resources_is_documented() -> None:
    text = (REFERENCE / "resources.md").read_text()
    for field in (
        "groups[].custom.memoryGb",
        "scheduler.eta",
        "completion.ttlSecondsAfterFinished",
    ):
        assert f"`{field}`" in text
    assert "kvTransfer" not in text


def test_the_manual_builds_with_no_warning(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "site" / "reference" / "resources" / "index.html").is_file()


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "python -m pytest" in readme and "cadence run manifests/examples/" in readme


def test_nothing_in_the_repository_points_outside_it() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    outside = ("../" + "shared", "DESIGN" + ".md", "BASELINES" + ".md", "CATALOG" + ".md")
    found = []
    for name in tracked:
        path = ROOT / name
        if path.suffix in {".png", ".gz", ".ico"} or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{name}: {o}" for o in outside if o in text]
    assert not found, found


def _families(collector: Any) -> set[str]:
    return {family.name for family in collector.collect()}


def test_the_metrics_page_names_every_metric_the_operator_and_a_worker_export() -> None:
    """The page is written by hand (the worker's and trainer's collectors need an engine
    and a model): this keeps it whole for the operator's and a worker's."""
    from cadence.operator.control.config import LoopConfig  # noqa: PLC0415
    from cadence.operator.control.group_stats import GroupStats  # noqa: PLC0415
    from cadence.operator.control.loop import ControlLoop  # noqa: PLC0415
    from cadence.operator.kube.metrics import OperatorMetrics, RunSeries  # noqa: PLC0415
    from cadence.scheduler.cadence import CadencePolicy  # noqa: PLC0415
    from cadence.scheduler.snapshot import Knobs  # noqa: PLC0415
    from cadence.trainer.client import TrainerClient  # noqa: PLC0415
    from cadence.worker.app import _CoreCollector  # noqa: PLC0415
    from tests.worker.factories import Pool  # noqa: PLC0415

    page = (REFERENCE / "metrics.md").read_text()
    trainer = TrainerClient("http://127.0.0.1:9", "t")  # never called
    loop = ControlLoop(
        CadencePolicy(), LoopConfig(knobs=Knobs(h_min=1, delta=1, eta=1)), trainer, {}, "t"
    )
    metrics = OperatorMetrics()
    metrics.runs[("ns", "run")] = RunSeries(pool="p", loop=loop, groups={"p-g": GroupStats()})
    metrics.reconciles[("rolloutpools", "ns", "p")] += 1
    names = _families(metrics) | _families(_CoreCollector(Pool().add("w0")))
    missing = sorted(n for n in names if f"`{n}`" not in page)
    asyncio.run(trainer.aclose())
    assert not missing, f"docs/reference/metrics.md lacks {missing}"
    assert len(names) > 25
