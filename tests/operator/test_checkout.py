"""A checkout of the repository must not break the interpreter started inside it."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT


def test_python_run_from_the_repository_root_gets_the_standard_operator_module() -> None:
    # -S skips site-packages, whose .pth files may import `operator` early and hide the
    # problem; -c puts the current directory (the repository root) first on sys.path.
    probe = "import collections, operator; assert operator.eq(2, 2); print(operator.itemgetter)"
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "itemgetter" in done.stdout
