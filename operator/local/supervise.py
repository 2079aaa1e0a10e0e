"""Keeps every process of `cadence run` running, as Kubernetes keeps a run's pods, so that
no single process death stops the run.

The trainer and the reference environment are restarted in place when they exit: same
command, same port, so every worker's URL for them still holds, and the trainer resumes
from the ledger in its state dir. A worker host (or a vLLM worker) that exits, killed,
drained or crashed, is replaced by a fresh process whose workers have new names, as a
rescheduled pod's; the control loop takes them in once they answer, and re-queues what
the old ones held once it has missed them for its `lost_after_s`.

A process that is running but has not answered `/healthz` for `UNRESPONSIVE_S` (frozen,
or a worker whose decoding stalled) is killed, and so restarted or replaced, as a
kubelet's liveness probe would. A shorter pause is not a death: the control loop takes
a worker that answers again back into the pool.

A process that exits while it starts is started again after a backoff that doubles (1 s,
2 s, ... 30 s), and the run gives up, one sentence naming the log, after `START_TRIES`
failed starts in a row of the same process (or pool slot).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cadence.operator.control.loop import ControlLoop
from cadence.operator.local.chaos import Target
from cadence.operator.local.processes import Children, free_port
from cadence.worker.api import WorkerState

log = logging.getLogger("cadence.run")

WATCH_S = 0.1  # how often exits are looked for
START_S = 600.0  # a start that has not answered /healthz by then failed
START_TRIES = 5
BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
HEALTH_S = 5.0  # how often a serving process is asked /healthz
UNRESPONSIVE_S = 120.0  # unanswered (or unhealthy) that long: killed and started afresh
# vLLM workers on one machine's CPUs: a destination engine sharing two cores with two
# others took over 20 s (the worker's default pull timeout) to schedule the read of a
# pull, whose blocks the source freed after its 30 s lease. The timeout stays below the
# lease, so a destination never reads blocks its source may have freed.
KV_LEASE_S = 120
KV_PULL_TIMEOUT_S = 90.0

State = Literal["starting", "serving", "stopping"]


@dataclass(frozen=True, slots=True)
class PoolWorker:
    id: str
    accelerator: str
    affinity: int
    price_per_hour: float
    # The group's plan (an emulated worker's degree and memory share; a vLLM worker's KV
    # tokens and longest context); None: the worker's own defaults.
    tensor_parallel: int | None = None
    memory_utilization: float | None = None
    kv_tokens: int | None = None
    max_model_len: int | None = None


class Supervisor:
    """The run's child processes: started, watched, restarted or replaced."""

    def __init__(
        self,
        children: Children,
        common: list[str],
        weights: Path,
        engine: Literal["emulated", "vllm"] = "emulated",
        *,
        kv_transfer: bool = True,
    ) -> None:
        self.children = children
        self.kv_transfer = kv_transfer  # vLLM workers open a KV side channel each
        self.common = common  # every worker's options
        self.weights = weights  # each worker keeps its versions in its own folder below
        self.engine = engine
        self.urls: dict[str, str] = {}  # worker id -> URL
        self.hosted: dict[str, list[str]] = {}  # host URL -> worker ids
        self.members: dict[str, list[PoolWorker]] = {}  # worker process name -> its workers
        self.loop: ControlLoop | None = None
        self.latest: Mapping[str, WorkerState] = {}  # the loop's last observation
        self.events: list[str] = []
        self.restarts: Counter[str] = Counter()  # trainer, environment
        self.replaced = 0  # workers replaced
        self.failed: str | None = None  # why the run cannot go on
        self.state: dict[str, State] = {}
        self._slot: dict[str, str] = {}  # process name -> the slot it fills (its first name)
        self._failures: Counter[str] = Counter()  # slot -> failed starts in a row
        self._due: dict[str, float] = {}  # exited process -> when to start it (or its heir)
        self._waiting: dict[str, asyncio.Task[None]] = {}
        self._generation = 0
        self._unanswered_since: dict[str, float] = {}
        self.frozen: set[str] = set()  # held by chaos until their time is up

    # --- starting ----------------------------------------------------------------------

    def start_service(self, name: str, args: list[str]) -> str:
        """The trainer or the environment; returns its URL."""
        url = self.children.start(name, args)
        self.state[name] = "starting"
        self._slot[name] = name
        return url

    async def healthy(self, name: str, within_s: float) -> None:
        """Wait for a first start: a failure there fails the run at once (a bad setting,
        not a fault)."""
        await self.children.healthy(name, within_s)
        self.state[name] = "serving"

    async def start_pool(self, workers: list[PoolWorker], hosts: int) -> None:
        if self.engine == "vllm":
            names = [self._start_single(w, w.id) for w in workers]
        else:
            n = max(1, min(hosts, len(workers)))
            names = [self._start_host(f"host-{i}", workers[i::n], f"host-{i}") for i in range(n)]
        await asyncio.gather(*(self.healthy(name, within_s=START_S) for name in names))

    def _start_host(self, name: str, workers: list[PoolWorker], slot: str) -> str:
        hosted = [_hosted(w) for w in workers]
        hosting = [a for h in hosted for a in ("--hosted", h)]
        args = ["worker", "--id", name, *hosting, "--weights-dir", str(self.weights)]
        url = self.children.start(name, [*args, *self.common])
        self.members[name] = workers
        self.hosted[url] = [w.id for w in workers]
        self.urls.update({w.id: f"{url}/{w.id}" for w in workers})
        self.state[name] = "starting"
        self._slot[name] = slot
        return name

    def _start_single(self, w: PoolWorker, slot: str) -> str:
        args = ["worker", "--id", w.id, "--engine", "vllm", "--accelerator", w.accelerator]
        args += ["--affinity", str(w.affinity), "--weights-dir", str(self.weights / w.id)]
        if w.kv_tokens is not None:
            args += ["--kv-tokens", str(w.kv_tokens)]
        if w.max_model_len is not None:
            args += ["--max-model-len", str(w.max_model_len)]
        if self.kv_transfer:
            args += ["--kv-transfer-port", str(free_port()), "--kv-lease-s", str(KV_LEASE_S)]
            args += ["--kv-pull-timeout-s", str(KV_PULL_TIMEOUT_S)]
        url = self.children.start(w.id, [*args, *self.common])
        self.members[w.id] = [w]
        self.urls[w.id] = url
        self.state[w.id] = "starting"
        self._slot[w.id] = slot
        return w.id

    # --- what chaos strikes ------------------------------------------------------------

    def live(self) -> list[Target]:
        """Processes starting or serving (not told to stop), with what each worker process
        holds."""
        holding = {w for w, st in self.latest.items() if st.residents or st.parked}
        parked = {w for w, st in self.latest.items() if st.parked}
        out = []
        for name, state in sorted(self.state.items()):
            if state == "stopping" or name in self.frozen:
                continue
            if name in self.members:
                ids = {w.id for w in self.members[name]}
                out.append(Target(name, "worker", bool(ids & holding), bool(ids & parked)))
            else:
                out.append(Target(name, "environment" if name == "environment" else "trainer"))
        return out

    def send(self, name: str, sig: signal.Signals) -> None:
        """A fault: `sig` to `name`, which is no longer counted as live; its exit is not a
        failed start, whenever it comes."""
        self.state[name] = "stopping"
        self.children.send(name, sig)
        workers = self.members.get(name, [])
        held = f" ({', '.join(w.id for w in workers)})" if workers else ""
        self.events.append(f"{sig.name} to {name}{held}")
        log.warning("chaos: %s to %s", sig.name, name)

    def hold(self, name: str, sig: signal.Signals, seconds: float) -> None:
        """A fault undone after `seconds`: SIGSTOP (the process and all it started, then
        SIGCONT), or SIGUSR1 (a worker holds its decoding, then a second SIGUSR1). It
        stays in its slot: a pause is not a death, unless it outlasts UNRESPONSIVE_S."""
        if sig == signal.SIGSTOP:
            self.children.pause(name, True)
        else:
            self.children.send(name, sig)
        self.frozen.add(name)
        workers = self.members.get(name, [])
        held = f" ({', '.join(w.id for w in workers)})" if workers else ""
        self.events.append(f"{sig.name} to {name}{held} for {seconds:.0f} s")
        log.warning("chaos: %s to %s for %.0f s", sig.name, name, seconds)
        process = self.children.processes[name]

        async def undo() -> None:
            await asyncio.sleep(seconds)
            self.frozen.discard(name)
            if self.children.processes.get(name) is process and process.poll() is None:
                if sig == signal.SIGSTOP:
                    self.children.pause(name, False)
                else:
                    self.children.send(name, sig)
                log.warning("chaos: %s to %s undone", sig.name, name)

        self._waiting[f"undo {name}"] = asyncio.create_task(undo())

    async def until_serving(self, name: str) -> None:
        """Return once `name` serves (at once if it does), or the run has failed."""
        while self.state.get(name) != "serving" and self.failed is None:
            await asyncio.sleep(WATCH_S)

    # --- watching ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Restart or replace whatever exits, while the block runs."""
        tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._probe())]
        try:
            yield
        finally:
            for task in [*tasks, *self._waiting.values()]:
                task.cancel()
            await asyncio.gather(*tasks, *self._waiting.values(), return_exceptions=True)

    async def _watch(self) -> None:
        while self.failed is None:
            now = time.monotonic()
            for name, state in list(self.state.items()):
                if not self.children.running(name):
                    self._exited(name, state, now)
            for name, when in list(self._due.items()):
                if when <= now:
                    del self._due[name]
                    self._start_again(name)
            await asyncio.sleep(WATCH_S)

    async def _probe(self) -> None:
        """Kill what has been serving but unanswering for UNRESPONSIVE_S; the watcher
        then restarts or replaces it as it does any exit."""
        while self.failed is None:
            serving = [n for n, st in sorted(self.state.items()) if st == "serving"]
            answers = await asyncio.gather(
                *(self.children.answers(n, timeout_s=HEALTH_S) for n in serving)
            )
            now = time.monotonic()
            for name, answered in zip(serving, answers, strict=True):
                if answered or self.state.get(name) != "serving":
                    self._unanswered_since.pop(name, None)
                    continue
                since = self._unanswered_since.setdefault(name, now)
                if now - since >= UNRESPONSIVE_S:
                    del self._unanswered_since[name]
                    log.warning(
                        "%s has not answered /healthz for %.0f s; killing it to start afresh",
                        name,
                        now - since,
                    )
                    self.events.append(f"{name} unresponsive for {now - since:.0f} s, killed")
                    self.children.send(name, signal.SIGKILL)
            await asyncio.sleep(HEALTH_S)

    def _exited(self, name: str, state: State, now: float) -> None:
        code = self.children.processes[name].returncode
        slot = self._slot[name]
        del self.state[name]
        if state == "starting":  # it never served: back off, and give up in the end
            self._failures[slot] += 1
            tries = self._failures[slot]
            if tries >= START_TRIES:
                where = f"; see {self.children.logs / f'{name}.log'}" if self.children.logs else ""
                self.failed = f"{name} exited {tries} times in a row while starting{where}"
                return
            delay = min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (tries - 1))
            log.warning(
                "%s exited with status %s while starting; again in %.0f s", name, code, delay
            )
            self._due[name] = now + delay
        else:
            log.warning("%s exited with status %s", name, code)
            self._due[name] = now

    def _start_again(self, name: str) -> None:
        if name in self.members:
            fresh = self._replace(name)
        else:
            self.children.restart(name)
            self.restarts[name] += 1
            self.events.append(f"restarted {name}")
            fresh = name
        self.state[fresh] = "starting"
        self._waiting[fresh] = asyncio.create_task(self._join(fresh))

    def _replace(self, name: str) -> str:
        """A fresh worker process in place of `name`, its workers renamed."""
        workers = self.members.pop(name)
        self._generation += 1
        g = self._generation
        fresh = [
            PoolWorker(_renamed(w.id, g), w.accelerator, w.affinity, w.price_per_hour)
            for w in workers
        ]
        slot = self._slot[name]
        if self.engine == "vllm":
            return self._start_single(fresh[0], slot)
        return self._start_host(_renamed(name, self._generation), fresh, slot)

    async def _join(self, name: str) -> None:
        """Wait for a restarted or fresh process to answer; then it serves (a fresh
        worker process joins the loop). An exit meanwhile is the watcher's to handle."""
        process = self.children.processes[name]  # a restart later is another process
        try:
            await self.children.healthy(name, within_s=START_S)
        except RuntimeError as e:
            if process.poll() is None:  # it never answered: count it as exited
                log.warning("%s", e)
                process.kill()
            return
        finally:
            if self._waiting.get(name) is asyncio.current_task():
                del self._waiting[name]
        if self.children.processes[name] is not process or self.state.get(name) != "starting":
            return
        self.state[name] = "serving"
        self._failures[self._slot[name]] = 0
        if name not in self.members:
            return
        joined = {w.id: self.urls[w.id] for w in self.members[name]}
        host = None if self.engine == "vllm" else self.children.urls[name]
        assert self.loop is not None
        self.loop.add_workers(joined, host=host)
        self.replaced += len(joined)
        self.events.append(f"replaced by {', '.join(sorted(joined))}")


def _renamed(name: str, generation: int) -> str:
    """A replacement's name: `h800-0` -> `h800-0-r1`, `h800-0-r1` -> `h800-0-r2`."""
    return f"{re.sub(r'-r[0-9]+$', '', name)}-r{generation}"


def _hosted(w: PoolWorker) -> str:
    """`cadence worker --hosted`'s ID:ACCELERATOR:AFFINITY[:TP:MEMORY_SHARE]."""
    spec = f"{w.id}:{w.accelerator}:{w.affinity}"
    if w.tensor_parallel is not None and w.memory_utilization is not None:
        spec += f":{w.tensor_parallel}:{w.memory_utilization}"
    return spec
