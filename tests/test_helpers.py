"""The suite's waits stretch with the machine's load and still end."""

from __future__ import annotations

import os

import pytest

from tests.helpers import LoadedDeadline


def test_a_wait_lasts_longer_on_a_loaded_machine_but_not_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    load = [1.0]
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (load[0], 0.0, 0.0))
    idle = LoadedDeadline(10.0, clock=lambda: now[0])
    now[0] = 10.5
    assert idle.spent()  # load 1 on 2 CPUs: wall seconds count whole
    load[0], now[0] = 20.0, 0.0  # ten deep per CPU: capped at eight times slower
    busy = LoadedDeadline(10.0, clock=lambda: now[0])
    now[0] = 79.0
    assert not busy.spent()
    now[0] = 81.0
    assert busy.spent()
    assert "81 s of a loaded machine" in str(busy)
