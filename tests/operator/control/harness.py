"""The control loop in one process: real worker and trainer apps behind an ASGI router,
emulated engines on a fake clock, so a test drives cycles and decode steps one by one.

Nothing here replaces a component: the loop talks HTTP to `create_app` of the worker and
the trainer through httpx's ASGI transport; only the network and time are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cadence.common.sources import Destinations
from cadence.operator.control.config import LoopConfig
from cadence.operator.control.loop import ControlLoop
from cadence.scheduler.cadence import CadencePolicy
from cadence.scheduler.snapshot import Knobs
from cadence.trainer.app import create_app as trainer_app
from cadence.trainer.client import TrainerClient
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer
from cadence.worker.app import create_app as worker_app
from cadence.worker.client import Peers, TrainerSender
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine
from cadence.worker.held import Identity
from cadence.worker.host import create_host_app
from cadence.worker.outbox import Outbox

from ...worker.factories import CountingSource, FakeClock, deployment

TOKEN = "s3cret"
TRAINER = "http://trainer"


class Router(httpx.AsyncBaseTransport):
    """Routes each request to the app named by its URL's host; a host in `down` does not
    answer, as a dead pod's address would not; a host in `full` refuses placements (409
    no_room), as a worker whose KV filled since it was observed does."""

    def __init__(self) -> None:
        self.apps: dict[str, httpx.ASGITransport] = {}
        self.down: set[str] = set()
        self.full: set[str] = set()

    def add(self, host: str, app: object) -> None:
        self.apps[host] = httpx.ASGITransport(app=app)  # type: ignore[arg-type]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.down or host not in self.apps:
            raise httpx.ConnectError(f"{host} does not answer", request=request)
        if (
            host in self.full
            and request.method == "POST"
            and request.url.path == "/v1/trajectories"
        ):
            problem = {"error": f"{host} has no room", "reason": "no_room"}
            return httpx.Response(409, json=problem, request=request)
        return await self.apps[host].handle_async_request(request)


@dataclass
class LocalPool:
    """A trainer and emulated workers reached only through HTTP, on one fake clock."""

    trainer: Trainer
    clock: FakeClock = field(default_factory=FakeClock)
    router: Router = field(default_factory=Router)
    cores: dict[str, WorkerCore] = field(default_factory=dict)
    hosts: dict[str, list[str]] = field(default_factory=dict)  # host name -> its workers

    def __post_init__(self) -> None:
        self.router.add("trainer", trainer_app(self.trainer, TOKEN, train=False))

    def add_worker(self, wid: str, capacity: int = 100_000) -> WorkerCore:
        peers = Peers(TOKEN, self.router, Destinations(hosts=self.router.apps.keys()))
        core = WorkerCore(
            Identity(wid, "H800", 0),
            EmulatedEngine(deployment(capacity=capacity), CountingSource(), clock=self.clock),
            self.clock,
            peers.claim,
            peers.release,
            0,
            outbox=Outbox(TrainerSender(TRAINER, TOKEN, transport=self.router), self.clock),
        )
        self.cores[wid] = core
        self.router.add(wid, worker_app(core, TOKEN, run_decode_loop=False))
        return core

    def host(self, name: str, wids: list[str]) -> None:
        """Serve workers already added from one host process too (`worker/host.py`), at
        `http://<name>/<worker>`."""
        self.router.add(name, create_host_app({w: self.cores[w] for w in wids}, TOKEN))
        self.hosts[name] = wids

    def loop(
        self, knobs: Knobs, *, lost_after_s: float = 10.0, hosted: bool = False
    ) -> ControlLoop:
        """A loop over every worker; with `hosted`, the hosted ones through their host."""
        workers = {wid: f"http://{wid}" for wid in self.cores}
        hosts = {f"http://{h}": ws for h, ws in self.hosts.items()} if hosted else {}
        if hosted:
            workers |= {w: f"http://{h}/{w}" for h, ws in self.hosts.items() for w in ws}
        return ControlLoop(
            policy=CadencePolicy(),
            config=LoopConfig(knobs=knobs, period_s=0.0, lost_after_s=lost_after_s),
            trainer=TrainerClient(TRAINER, TOKEN, transport=self.router),
            workers=workers,
            token=TOKEN,
            hosts=hosts,
            clock=self.clock.now,
            transport=self.router,
        )

    async def run_until_delivered(self, loop: ControlLoop, samples: int, rounds: int) -> None:
        """Cycle the loop and decode 4 steps, up to `rounds` times, until the trainer has
        `samples` delivered."""
        for _ in range(rounds):
            await loop.cycle()
            await self.decode(steps=4)
            if self.trainer.ledger.counts().get("delivered", 0) == samples:
                return

    async def decode(self, steps: int = 1, *, skip: frozenset[str] = frozenset()) -> None:
        """Every live worker decodes `steps` steps and hands what finished to the trainer;
        those in `skip` answer but do not decode (a stalled engine)."""
        for wid, core in self.cores.items():
            if wid in self.router.down or wid in skip:
                continue
            for _ in range(steps):
                if core.resident:
                    await core.step()
            if core.outbox is not None:
                await core.outbox.flush()


def trainer(model: Path, state: Path, *, groups: int = 2, size: int = 2) -> Trainer:
    return Trainer(
        TrainerConfig(
            model_path=model,
            state_dir=state,
            group_size=size,
            batch_groups=groups,
            iterations=2,
            eta=1,
            max_tokens=8,
        )
    )
