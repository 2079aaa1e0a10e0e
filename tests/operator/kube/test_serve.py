"""How `cadence operator` logs: what a platform engineer reads in `kubectl logs`."""

from __future__ import annotations

import json
import re
import subprocess
import sys

_LOGS = """
import logging
from cadence.operator.kube.serve import configure_logging
configure_logging({format!r}, verbose={verbose})
logging.getLogger("cadence.operator").info("pool fleet bound")
logging.getLogger("cadence.loop").debug("cycle planned 3 actions")
"""


def _logged(log_format: str, verbose: bool) -> list[str]:
    program = _LOGS.format(format=log_format, verbose=verbose)
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    return (done.stdout + done.stderr).splitlines()


def test_the_operator_logs_info_with_time_and_level_and_debug_when_verbose() -> None:
    (line,) = _logged("full", verbose=False)
    stamp = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]"
    assert re.match(rf"{stamp} cadence\.operator +\[INFO +\] pool fleet bound$", line), line
    assert any("cycle planned 3 actions" in line for line in _logged("full", verbose=True))


def test_the_operator_can_log_one_json_object_a_line() -> None:
    (line,) = _logged("json", verbose=False)
    record = json.loads(line)
    assert record["message"] == "pool fleet bound" and record["severity"] == "info"
    assert record["timestamp"].startswith("20")


def test_a_program_that_set_up_its_logging_keeps_it() -> None:
    # A test suite running the operator in process: its own handlers stay in charge.
    program = (
        "import logging\nlogging.basicConfig(level=logging.INFO, format='mine: %(message)s')\n"
    )
    program += _LOGS.format(format="full", verbose=False)
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert (done.stdout + done.stderr).splitlines() == ["mine: pool fleet bound"]
