"""`--chaos`: a fault every interval whatever the struck processes' replacements are doing,
so halving the interval doubles the faults; faults of every kind (worker hosts killed or
drained mid-hand-off, the trainer, the environment), only of the kinds asked for, and the
same ones under the same seed. On a pool of stand-in processes, and a fake sleep."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from cadence.operator.local.chaos import HOLD_S, Chaos, Strike, Target, parse_targets


class Pool:
    """Processes live until struck; a struck one's replacement never comes up (its node
    is slow to schedule it, say)."""

    def __init__(self, targets: list[Target]) -> None:
        self.up = {t.name: t for t in targets}
        self.sent: list[tuple[str, signal.Signals]] = []

    def live(self) -> list[Target]:
        return list(self.up.values())

    def send(self, name: str, sig: signal.Signals) -> None:
        self.sent.append((name, sig))
        del self.up[name]


def _hosts(n: int) -> list[Target]:
    return [Target(f"host-{i}", "worker") for i in range(n)]


class Stop(Exception):
    pass


def _intervals(n: int) -> tuple[list[float], Callable[[float], Awaitable[None]]]:
    """A sleep that returns at once `n` times, then ends the chaos."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        if len(slept) == n:
            raise Stop
        slept.append(seconds)
        await asyncio.sleep(0)

    return slept, sleep


def test_a_fault_comes_every_interval_whatever_the_replacements_do() -> None:
    pool = Pool([*_hosts(6), Target("trainer", "trainer")])
    chaos = Chaos(0.5, {"workers", "trainer"}, 1, pool.live, pool.send)
    slept, sleep = _intervals(5)
    with pytest.raises(Stop):
        asyncio.run(chaos.run(sleep))
    assert slept == [0.5] * 5
    assert len(pool.sent) == 5 == sum(chaos.counts.values())  # none waited on a replacement
    assert len({name for name, _ in pool.sent}) == 5  # a struck process is not struck again


def test_nothing_is_struck_when_nothing_is_live() -> None:
    pool = Pool([])
    chaos = Chaos(1.0, {"workers", "trainer"}, 0, pool.live, pool.send)
    assert chaos.strike() is None and pool.sent == []


def test_every_kind_of_fault_is_dealt_and_counted() -> None:
    chaos = Chaos(1.0, {"workers", "trainer", "environment"}, 3, _everything, lambda *_: None)
    struck = [chaos.strike() for _ in range(200)]
    assert all(s is not None for s in struck)
    assert set(chaos.counts) == {
        "worker_sigkill",
        "worker_sigterm",
        "trainer_sigkill",
        "environment_sigkill",
    }
    assert all(n > 20 for n in chaos.counts.values()), chaos.counts
    signals = {(s.fault, s.signal) for s in struck if s is not None}
    assert ("worker_sigterm", signal.SIGTERM) in signals
    assert ("trainer_sigkill", signal.SIGKILL) in signals


def _everything() -> list[Target]:
    return [
        Target("host-0", "worker", holding=True, handing_off=True),
        Target("host-1", "worker", holding=True),
        Target("host-2", "worker"),
        Target("trainer", "trainer"),
        Target("environment", "environment"),
    ]


def test_only_the_targets_asked_for_are_struck() -> None:
    chaos = Chaos(1.0, {"trainer"}, 0, _everything, lambda *_: None)
    struck = [chaos.strike() for _ in range(20)]
    assert {s.name for s in struck if s is not None} == {"trainer"}
    assert chaos.counts["trainer_sigkill"] == 20 and chaos.counts["worker_sigkill"] == 0


def test_a_host_is_drained_mid_hand_off_and_killed_holding_work() -> None:
    chaos = Chaos(1.0, {"workers"}, 5, _everything, lambda *_: None)
    struck = [s for s in (chaos.strike() for _ in range(100)) if s is not None]
    assert {s.name for s in struck if s.fault == "worker_sigterm"} == {"host-0"}
    assert {s.name for s in struck if s.fault == "worker_sigkill"} == {"host-0", "host-1"}


def test_without_a_host_mid_hand_off_any_host_is_drained() -> None:
    calm = [replace(t, handing_off=False, holding=False) for t in _everything()]
    chaos = Chaos(1.0, {"workers"}, 5, lambda: calm, lambda *_: None)
    struck = [s for s in (chaos.strike() for _ in range(100)) if s is not None]
    assert {s.name for s in struck} == {"host-0", "host-1", "host-2"}


def test_the_same_seed_deals_the_same_faults() -> None:
    def deal(seed: int) -> list[Strike | None]:
        chaos = Chaos(
            1.0, {"workers", "trainer", "environment"}, seed, _everything, lambda *_: None
        )
        return [chaos.strike() for _ in range(30)]

    assert deal(7) == deal(7)
    assert deal(7) != deal(8)


def test_chaos_targets_are_named() -> None:
    assert parse_targets("workers, trainer") == {"workers", "trainer"}
    with pytest.raises(ValueError, match="unknown chaos target 'nodes'; known: workers"):
        parse_targets("workers,nodes")


def test_freezes_and_stalls_are_held_for_a_while_and_never_sent_as_deaths() -> None:
    held: list[tuple[str, signal.Signals, float]] = []
    sent: list[tuple[str, signal.Signals]] = []
    chaos = Chaos(
        1.0,
        {"freeze", "stall"},
        2,
        _everything,
        lambda name, sig: sent.append((name, sig)),
        hold=lambda name, sig, s: held.append((name, sig, s)),
    )
    struck = [chaos.strike() for _ in range(40)]
    assert sent == [] and len(held) == 40
    assert {sig for _, sig, _ in held} == {signal.SIGSTOP, signal.SIGUSR1}
    assert {name for name, _, _ in held} <= {"host-0", "host-1", "host-2"}
    low, high = HOLD_S
    assert all(low <= s <= high for _, _, s in held)
    assert chaos.counts["worker_sigstop"] + chaos.counts["worker_stall"] == 40
    assert all(s is not None and s.seconds is not None for s in struck)
