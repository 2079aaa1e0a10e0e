"""`cadence run --chaos SECONDS`: one fault every SECONDS, the faults a cluster deals out.

A fault is a signal to one live process: SIGKILL to a worker host (a lost node: nothing
drained or handed back), SIGTERM to a worker host (a node drain or scale-in: it drains and
exits, preferably while a trajectory parked on it is being handed off), SIGKILL to the
trainer, SIGKILL to the reference environment, and two faults asked for by name: target
`freeze`, SIGSTOP to a worker host for HOLD_S seconds then SIGCONT, as a long pause, a
throttled CPU or a network blip look to the control loop; target `stall`, SIGUSR1 to a
worker host, whose decoding then holds for HOLD_S seconds while it goes on answering, as
a hung engine (`cadence worker` takes SIGUSR1 so). What restarts or replaces a process is not
chaos's business (`operator/local/supervise.py`); the next fault comes one interval after
the last whatever the replacement is doing, so halving the interval doubles the faults.
A replacement still starting is live and may be struck too (a pod that dies while it
starts); a process already told to stop is not struck again.

Each strike picks one of the enabled faults that has a target, at random, then its
target; the choices come from one `random.Random(seed)`, so a run's faults repeat under
its seed as far as the processes' timing lets them.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

Role = Literal["worker", "trainer", "environment"]

TARGETS = ("workers", "trainer", "environment", "freeze", "stall")  # --chaos-targets
# By default chaos strikes worker processes, the faults a pool sees most; the trainer and
# the environment are one process each, and a run struck there every few seconds spends
# most of its time waiting for them to start again.
DEFAULT_TARGETS = frozenset({"workers"})
HOLD_S = (5.0, 60.0)  # a frozen or stalled host stays so this long, drawn uniformly

# Fault -> (the target that enables it, the role struck, the signal). The order is the
# order they are chosen among.
FAULTS: dict[str, tuple[str, Role, signal.Signals]] = {
    "worker_sigkill": ("workers", "worker", signal.SIGKILL),
    "worker_sigterm": ("workers", "worker", signal.SIGTERM),
    "trainer_sigkill": ("trainer", "trainer", signal.SIGKILL),
    "environment_sigkill": ("environment", "environment", signal.SIGKILL),
    "worker_sigstop": ("freeze", "worker", signal.SIGSTOP),
    "worker_stall": ("stall", "worker", signal.SIGUSR1),
}
HELD = (signal.SIGSTOP, signal.SIGUSR1)  # faults undone after their seconds


@dataclass(frozen=True, slots=True)
class Target:
    """A live process, and what its workers hold (for worker hosts)."""

    name: str
    role: Role
    holding: bool = False  # its workers hold trajectories, resident or parked
    handing_off: bool = False  # a trajectory parked on it waits to move to another worker


@dataclass(frozen=True, slots=True)
class Strike:
    fault: str
    name: str
    signal: signal.Signals
    seconds: float | None = None  # how long a SIGSTOP or a stall holds


def parse_targets(text: str) -> frozenset[str]:
    """`workers,trainer` -> {"workers", "trainer"}; ValueError names an unknown one."""
    names = {t.strip() for t in text.split(",") if t.strip()}
    unknown = sorted(names - set(TARGETS))
    if unknown:
        raise ValueError(f"unknown chaos target {unknown[0]!r}; known: {', '.join(TARGETS)}")
    if not names:
        raise ValueError(f"--chaos-targets names at least one of {', '.join(TARGETS)}")
    return frozenset(names)


class Chaos:
    """Strikes every `every_s` seconds at what `live()` lists, through `send`."""

    def __init__(
        self,
        every_s: float,
        targets: Collection[str],
        seed: int,
        live: Callable[[], Sequence[Target]],
        send: Callable[[str, signal.Signals], None],
        *,
        hold: Callable[[str, signal.Signals, float], None] | None = None,
    ) -> None:
        self.every_s = every_s
        self.enabled = [f for f, (target, _, _) in FAULTS.items() if target in targets]
        self.live = live
        self.send = send
        self.hold = hold  # a fault now, undone after the seconds given
        self.counts: Counter[str] = Counter(dict.fromkeys(self.enabled, 0))
        self.strikes: list[Strike] = []
        self._rng = random.Random(seed)

    def strike(self) -> Strike | None:
        """One fault now, or None when nothing chaos may strike is live."""
        up = self.live()
        faults = [f for f in self.enabled if any(t.role == FAULTS[f][1] for t in up)]
        if not faults:
            return None
        fault = self._rng.choice(faults)
        _, role, sig = FAULTS[fault]
        of_role = sorted((t for t in up if t.role == role), key=lambda t: t.name)
        if fault == "worker_sigkill":
            preferred = [t for t in of_role if t.holding]  # a loss that loses work
        elif fault == "worker_sigterm":
            preferred = [t for t in of_role if t.handing_off]  # a drain mid-hand-off
        else:
            preferred = []
        target = self._rng.choice(preferred or of_role)
        seconds = None
        if sig in HELD:
            seconds = self._rng.uniform(*HOLD_S)
            assert self.hold is not None, "a held fault needs its undoing"
            self.hold(target.name, sig, seconds)
        else:
            self.send(target.name, sig)
        self.counts[fault] += 1
        struck = Strike(fault, target.name, sig, seconds)
        self.strikes.append(struck)
        return struck

    async def run(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """Strike every interval until cancelled."""
        while True:
            await sleep(self.every_s)
            self.strike()
