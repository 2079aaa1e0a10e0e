"""What keeps a `cadence run`'s processes running: a trainer that exits is started again in
place, however often chaos kills it, even while it starts; one that keeps failing to start
fails the run in one sentence naming its log; a worker host that exits is replaced by one
whose workers have new names, and they join the control loop once they answer.

The processes are real (`sleep`), so exits and signals are the operating system's; what
`/healthz` would say is set by the test (`answering`)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
import uvicorn

from cadence.common import web
from cadence.operator.local import supervise
from cadence.operator.local.processes import Children
from cadence.operator.local.supervise import PoolWorker, Supervisor
from tests.helpers import eventually, eventually_async

pytestmark = pytest.mark.timeout(60)


class Processes(Children):
    """`Children` whose processes are `sleep 600`, healthy once the test says so (a name
    may be said to answer before it starts; a restart under it must be said again)."""

    def __init__(self, logs: Path | None = None) -> None:
        super().__init__(logs, env={}, grace_s=1.0)
        self.answering: set[str] = set()
        self.started: list[str] = []

    def _spawn(self, name: str, sock: socket.socket | None) -> None:
        if sock is not None:
            sock.close()
        if name in self.processes:  # a restart answers when the test says so again
            self.answering.discard(name)
        self.started.append(name)
        self.processes[name] = subprocess.Popen(["sleep", "600"])

    async def healthy(self, name: str, within_s: float) -> None:
        process = self.processes[name]
        while name not in self.answering or self.processes[name] is not process:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with status {process.returncode} while starting")
            await asyncio.sleep(0.005)

    async def answers(self, name: str, timeout_s: float) -> bool:
        return name in self.answering


class Loop:
    """What the supervisor tells the control loop: workers that joined."""

    def __init__(self) -> None:
        self.joined: list[tuple[dict[str, str], str | None]] = []

    def add_workers(self, urls: Mapping[str, str], host: str | None = None) -> None:
        self.joined.append((dict(urls), host))


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervise, "WATCH_S", 0.005)
    monkeypatch.setattr(supervise, "BACKOFF_S", 0.005)
    monkeypatch.setattr(supervise, "HEALTH_S", 0.005)


async def _serving(sup: Supervisor, name: str) -> None:
    async def serving() -> bool:
        return sup.state.get(name) == "serving"

    await eventually_async(serving, timeout_s=10, what=f"{name} serving")


def test_a_trainer_killed_again_and_again_even_while_it_starts_is_started_again() -> None:
    async def go() -> Supervisor:
        children = Processes()
        async with children:
            sup = Supervisor(children, [], Path("/nonexistent"))
            children.answering.add("trainer")
            sup.start_service("trainer", ["trainer"])
            await sup.healthy("trainer", within_s=10)
            async with sup.watching():
                for _ in range(supervise.START_TRIES + 2):  # struck before it answers
                    process = children.processes["trainer"]
                    sup.send("trainer", signal.SIGKILL)

                    async def restarted(p: object = process) -> bool:
                        return children.processes["trainer"] is not p

                    await eventually_async(restarted, timeout_s=10, what="a restart")
                children.answering.add("trainer")
                await _serving(sup, "trainer")
                assert children.running("trainer")
        return sup

    sup = asyncio.run(go())
    assert sup.failed is None
    assert sup.restarts["trainer"] == supervise.START_TRIES + 2


def test_a_trainer_that_keeps_exiting_as_it_starts_fails_the_run_naming_its_log(
    tmp_path: Path,
) -> None:
    async def go() -> Supervisor:
        children = Processes(tmp_path)
        async with children:
            sup = Supervisor(children, [], tmp_path)
            children.answering.add("trainer")
            sup.start_service("trainer", ["trainer"])
            await sup.healthy("trainer", within_s=10)
            async with sup.watching():
                children.processes["trainer"].kill()  # a crash, not chaos
                for _ in range(supervise.START_TRIES):

                    async def started_again(n: int = len(children.started)) -> bool:
                        return len(children.started) > n or sup.failed is not None

                    await eventually_async(started_again, timeout_s=10, what="a restart")
                    children.processes["trainer"].kill()  # it dies as it starts

                async def failed() -> bool:
                    return sup.failed is not None

                await eventually_async(failed, timeout_s=10, what="the run given up")
        return sup

    sup = asyncio.run(go())
    log = tmp_path / "trainer.log"
    assert (
        sup.failed
        == f"trainer exited {supervise.START_TRIES} times in a row while starting; see {log}"
    )


def test_a_host_that_exits_is_replaced_and_its_new_workers_join_the_loop() -> None:
    workers = [PoolWorker("h800-0", "H800", 2, 2.0), PoolWorker("a910x-0", "A910X", 1, 1.2)]

    async def go() -> tuple[Supervisor, Loop, Processes]:
        children = Processes()
        loop = Loop()
        async with children:
            sup = Supervisor(children, ["--model", "m"], Path("/w"))
            sup.loop = loop  # type: ignore[assignment]
            children.answering.add("host-0")
            await sup.start_pool(workers, hosts=1)
            async with sup.watching():
                sup.send("host-0", signal.SIGTERM)  # drained, it exits
                children.answering.add("host-0-r1")
                await _serving(sup, "host-0-r1")
        return sup, loop, children

    sup, loop, children = asyncio.run(go())
    url = children.urls["host-0-r1"]
    assert loop.joined == [
        ({"h800-0-r1": f"{url}/h800-0-r1", "a910x-0-r1": f"{url}/a910x-0-r1"}, url)
    ]
    assert sup.replaced == 2 and sup.events == [
        "SIGTERM to host-0 (h800-0, a910x-0)",
        "replaced by a910x-0-r1, h800-0-r1",
    ]
    assert [t.name for t in sup.live()] == ["host-0-r1"]


def test_a_host_that_stops_answering_is_killed_and_replaced_and_a_short_pause_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frozen host (SIGSTOP, a hung process) exits nothing: without a probe it would
    hold its slot for ever. One that answers again within UNRESPONSIVE_S keeps it."""
    monkeypatch.setattr(supervise, "UNRESPONSIVE_S", 600.0)  # the pause: far below it
    workers = [PoolWorker("h800-0", "H800", 2, 2.0)]

    async def probed(sup: Supervisor, unanswered: bool) -> None:
        async def seen() -> bool:
            return ("host-0" in sup._unanswered_since) is unanswered

        await eventually_async(seen, timeout_s=10, what=f"the probe seeing {unanswered=}")

    async def go() -> tuple[Supervisor, Processes]:
        children = Processes()
        async with children:
            sup = Supervisor(children, ["--model", "m"], Path("/w"))
            sup.loop = Loop()  # type: ignore[assignment]
            children.answering.add("host-0")
            await sup.start_pool(workers, hosts=1)
            async with sup.watching():
                children.answering.discard("host-0")  # a short pause
                await probed(sup, unanswered=True)
                children.answering.add("host-0")
                await probed(sup, unanswered=False)
                assert children.running("host-0") and sup.events == []
                monkeypatch.setattr(supervise, "UNRESPONSIVE_S", 0.5)
                children.answering.discard("host-0")  # frozen for good
                children.answering.add("host-0-r1")
                await _serving(sup, "host-0-r1")
                assert not children.running("host-0")
        return sup, children

    sup, _ = asyncio.run(go())
    assert sup.events[0].startswith("host-0 unresponsive for ")
    assert sup.events[1:] == ["replaced by h800-0-r1"]


def test_a_sigkill_takes_everything_the_process_started_as_a_lost_node_would() -> None:
    """A vLLM worker's engine processes are its children: a SIGKILL of the worker alone
    left them running (2.7 GB each), and a chaos run filled the machine's memory."""
    children = Children(None, env={}, grace_s=1.0)
    node = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    children.processes["worker"] = node

    def group_alive() -> bool:
        try:
            os.killpg(node.pid, 0)
        except ProcessLookupError:
            return False
        return True

    eventually(lambda: len(_members(node.pid)) == 2, timeout_s=30, what="sh and its sleep")
    children.send("worker", signal.SIGKILL)
    node.wait()
    eventually(lambda: not group_alive(), timeout_s=30, what="the sleep it started gone")


def _members(group: int) -> list[int]:
    pgrep = ["pgrep", "-g", str(group)]
    out = subprocess.run(pgrep, capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in out.split()]


@pytest.mark.parametrize(
    ("status", "reason", "alive"),
    [
        (200, None, True),
        (503, "stalled", False),
        (503, "broken", False),
        (503, "cannot_train", True),
    ],
)
def test_a_child_counts_as_answering_unless_silent_stalled_or_broken(
    status: int, reason: str | None, alive: bool
) -> None:
    """What the supervisor kills after UNRESPONSIVE_S: a trainer that cannot train is not
    restarted for it (its batch would not change), a stalled or broken worker is."""
    from fastapi import FastAPI  # noqa: PLC0415
    from fastapi.responses import JSONResponse  # noqa: PLC0415

    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"reason": reason, "error": "x"}, status_code=status)

    async def go() -> tuple[bool, bool]:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error")
        server = web.EmbeddedServer(config)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        children = Children(None, env={})
        children.urls["svc"] = f"http://127.0.0.1:{port}"
        children.urls["gone"] = "http://127.0.0.1:9"  # nothing listens
        answered = await children.answers("svc", timeout_s=30)
        silent = await children.answers("gone", timeout_s=30)
        server.should_exit = True
        await serving
        return answered, silent

    answered, silent = asyncio.run(go())
    assert answered is alive and silent is False


def test_a_childs_port_is_bound_before_it_starts_and_kept_across_restarts(tmp_path: Path) -> None:
    """A port chosen free and bound later by the child was taken by another process in
    between under load ("address already in use"), which ended the run; the parent now
    binds it first and passes the socket, so a process that tries to take the port
    meanwhile cannot."""
    children = Children(tmp_path / "logs", env={"CADENCE_TOKEN": "s3cret"}, grace_s=5.0)
    url = children.start("environment", ["environment"])
    port = int(url.rsplit(":", 1)[1])

    def taken() -> bool:
        """Whether another process fails to bind the port (at once: the child has not yet
        imported anything, let alone bound a port of its own)."""
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port))
            except OSError:
                return True
            return False

    try:
        assert taken()
        asyncio.run(children.healthy("environment", within_s=60))
        children.kill("environment")
        assert children.restart("environment") == url
        assert taken()
        asyncio.run(children.healthy("environment", within_s=60))
    finally:
        children.stop()
