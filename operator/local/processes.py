"""A pool on one machine: worker processes and the trainer service, started and stopped
together. `cadence bench learn`, `cadence run` and the tests run the whole system this
way. Each worker is a `cadence worker` process, as each pod runs it.

A child must not outlive its parent, however the parent ends: Ctrl-C and SIGTERM stop the
children (`Children.stop`), and a parent killed outright (SIGKILL, the OOM killer) cannot,
so each child asks Linux for SIGTERM when its parent dies (PR_SET_PDEATHSIG). The child
asks for it itself, first thing (`_SPAWN`), rather than in a `preexec_fn`, which runs
Python between fork and exec and may deadlock in a parent that has threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

import httpx
import uvicorn

from cadence.common import web
from cadence.trainer.app import create_app
from cadence.trainer.trainer import Trainer

# `cadence` as a child process runs it, without relying on the console script's location.
CADENCE = [sys.executable, "-c", "from cadence.cli import entry; entry()"]

# `Children` start `cadence` so: when CADENCE_PARENT_PID names its parent, the child asks
# for SIGTERM (15) when that parent dies, then checks the parent has not died already. The
# signal comes when the *thread* that started the child ends, so only the main thread
# sets it (`Children.start`). Linux only; elsewhere the prologue does nothing.
PARENT_PID = "CADENCE_PARENT_PID"
_PROLOGUE = f"""
import os, sys
parent = os.environ.pop("{PARENT_PID}", "")
if parent and sys.platform == "linux":
    import ctypes
    ctypes.CDLL(None).prctl(1, {int(signal.SIGTERM)}, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        sys.exit("cadence: the process that started this one has exited")
"""
_SPAWN = [sys.executable, "-c", _PROLOGUE + "from cadence.cli import entry; entry()"]


def free_port() -> int:
    """A port free now. Another process may take it before it is bound: for a service
    this process starts, `Children` binds the port itself and passes the socket."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bound_socket(port: int = 0) -> socket.socket:
    """A TCP socket bound to `port` on 127.0.0.1 (0: any free one), not yet listening: the
    child it is passed to listens on it. SO_REUSEADDR, so a restarted child's port is
    bound again while the old one's connections linger in TIME_WAIT."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def wait_healthy(
    urls: Iterable[str], procs: Sequence[subprocess.Popen[bytes]], within_s: float
) -> None:
    """Wait until every URL answers /healthz; fail if a process exits or time runs out."""
    deadline = time.monotonic() + within_s
    for url in urls:
        while True:
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not become healthy within {within_s:.0f} s")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker exited while starting; see its log")
            time.sleep(0.2)


class Workers(dict[str, str]):
    """{worker id: URL}, with each worker's process (tests kill one to lose it)."""

    def __init__(self) -> None:
        super().__init__()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}


@contextlib.contextmanager
def worker_processes(
    ids: Sequence[str],
    args: Callable[[str], list[str]],
    *,
    env: dict[str, str],
    within_s: float,
    cwd: Path | None = None,
    logs: Path | None = None,
) -> Iterator[Workers]:
    """`cadence worker` processes, one per id with `args(id)` added, each on a free port;
    yields {id: URL} once all are healthy, and stops them (SIGTERM, then kill). Output
    goes to `logs/<id>.log` when `logs` is given, else nowhere. The synchronous face of
    `Children`, for callers without an event loop."""
    # In the caller's session, as before: vLLM workers started in a session of their own
    # here accepted trajectories and never decoded them (tests/worker/test_vllm_workers.py).
    children = Children(logs, env, grace_s=30.0, cwd=cwd, new_session=False)
    urls = Workers()
    try:
        for wid in ids:
            urls[wid] = children.start(wid, ["worker", "--id", wid, *args(wid)])
            urls.processes[wid] = children.processes[wid]
        wait_healthy(urls.values(), list(urls.processes.values()), within_s=within_s)
        yield urls
    finally:
        children.stop()


class Children:
    """Named `cadence` child processes, each on a free port with its log in `logs/` (or
    none); an async context that stops every one on the way out, however it is left (an
    error, Ctrl-C, SIGTERM): SIGTERM, which drains a worker, then SIGKILL after `grace_s`.
    Start them from the main thread: a child gets SIGTERM when its parent dies (see the
    module's docstring); one started from another thread does not ask for that."""

    def __init__(
        self,
        logs: Path | None,
        env: dict[str, str],
        grace_s: float = 10.0,
        cwd: Path | None = None,
        new_session: bool = True,
    ) -> None:
        self.logs = logs
        self.new_session = new_session
        self.env = {**os.environ, **env}
        self.grace_s = grace_s
        self.cwd = cwd
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}
        self._commands: dict[str, list[str]] = {}  # name -> its command, for `restart`

    async def __aenter__(self) -> Children:
        return self

    async def __aexit__(self, *_: object) -> None:
        await asyncio.shield(asyncio.to_thread(self.stop))

    def start(self, name: str, args: Sequence[str]) -> str:
        """Start `cadence ARGS --port P --listen-fd FD`, on a port this process binds and
        passes (so no other process can take it between choosing and binding); returns
        its URL (not yet healthy)."""
        sock = bound_socket()
        port = int(sock.getsockname()[1])
        self._commands[name] = [*args, "--port", str(port)]
        self.urls[name] = f"http://127.0.0.1:{port}"
        self._spawn(name, sock)
        return self.urls[name]

    def restart(self, name: str) -> str:
        """Start `name` again as it was started, on the same port, so whoever holds its URL
        reaches the new process (a restarted container keeps its Service's address). The
        old one must have exited. Should another process have taken the port meanwhile,
        the child is started without a socket, fails to bind, and its exit is a failed
        start like any other."""
        old = self.processes[name]
        if old.poll() is None:
            raise RuntimeError(f"{name} is still running")
        port = int(self.urls[name].rsplit(":", 1)[1])
        try:
            sock: socket.socket | None = bound_socket(port)
        except OSError:
            sock = None
        self._spawn(name, sock)
        return self.urls[name]

    def _spawn(self, name: str, sock: socket.socket | None) -> None:
        old = self.processes.get(name)
        if old is not None and old.poll() is not None:
            self._kill(old)  # whatever the exited one left running in its session
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.logs is not None:
            self.logs.mkdir(parents=True, exist_ok=True)
            out = (self.logs / f"{name}.log").open("ab")
        env = dict(self.env)
        env.pop(PARENT_PID, None)  # this process's own, if a `Children` started it
        if threading.current_thread() is threading.main_thread():
            env[PARENT_PID] = str(os.getpid())
        passed = () if sock is None else ("--listen-fd", str(sock.fileno()))
        try:
            self.processes[name] = subprocess.Popen(
                [*_SPAWN, *self._commands[name], *passed],
                cwd=self.cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Ctrl-C reaches this process only; it stops them.
                start_new_session=self.new_session,
                pass_fds=() if sock is None else (sock.fileno(),),
            )
        finally:
            if sock is not None:
                sock.close()  # the child holds it now
            if not isinstance(out, int):
                out.close()

    def running(self, name: str) -> bool:
        return self.processes[name].poll() is None

    async def healthy(self, name: str, within_s: float) -> None:
        """Wait until `name` answers /healthz; fail if it exits or time runs out."""
        deadline = time.monotonic() + within_s
        process = self.processes[name]  # a restart meanwhile is another process
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    answer = await http.get(f"{self.urls[name]}/healthz")
                    if answer.status_code == 200 and process.poll() is None:
                        return
                code = process.poll()
                if code is not None:
                    where = f"; see {self.logs / f'{name}.log'}" if self.logs else ""
                    raise RuntimeError(f"{name} exited with status {code} while starting{where}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not become healthy within {within_s:.0f} s")
                await asyncio.sleep(0.2)

    async def answers(self, name: str, timeout_s: float) -> bool:
        """Whether `name` answers /healthz within `timeout_s`, and not that it cannot work
        (a frozen process does not answer; a worker whose decoding stalled or whose
        engine broke answers 503 so). A trainer that cannot train answers too: a restart
        would not change its batch."""
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as http:
                answer = await http.get(f"{self.urls[name]}/healthz")
        except httpx.HTTPError:
            return False
        if answer.status_code != 503:
            return True
        try:
            reason = answer.json().get("reason")
        except ValueError:
            return False
        return reason not in ("stalled", "broken")

    def send(self, name: str, sig: signal.Signals) -> None:
        """Send `sig` and return: SIGKILL, as a lost node (nothing is drained or handed
        back); SIGTERM, as a node drain or scale-in (a worker drains and exits)."""
        if sig == signal.SIGKILL:
            self._kill(self.processes[name])
            return
        with contextlib.suppress(ProcessLookupError):
            self.processes[name].send_signal(sig)

    def pause(self, name: str, paused: bool) -> None:
        """SIGSTOP (or SIGCONT) `name` and, in its own session, everything it started: a
        frozen node stops all its processes at once."""
        sig = signal.SIGSTOP if paused else signal.SIGCONT
        process = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        if self.new_session:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)

    def kill(self, name: str) -> None:
        """SIGKILL, as a lost node: nothing is drained or handed back."""
        self._kill(self.processes[name])
        self.processes[name].wait()

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL `process` and, in its own session, everything it started: a vLLM
        worker's engine processes outlive a SIGKILL of the worker alone (2.7 GB each;
        a chaos run on vLLM once filled this machine's memory with them), as they would
        not outlive the loss of its node."""
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        if self.new_session:  # its session's group bears its pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)

    def stop(self) -> None:
        for p in self.processes.values():
            if p.poll() is None:
                p.terminate()
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)  # a frozen one must run to exit
        deadline = time.monotonic() + self.grace_s
        for p in self.processes.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(p)
                p.wait()


@contextlib.asynccontextmanager
async def serve_trainer(trainer: Trainer, token: str, port: int = 0) -> AsyncIterator[str]:
    """The trainer's service on 127.0.0.1 in this event loop; yields its URL."""
    config = uvicorn.Config(
        create_app(trainer, token),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        http=web.http_protocol(),
    )
    server = web.EmbeddedServer(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            serving.result()  # raises why it could not start
        await asyncio.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{bound}"
    finally:
        server.should_exit = True
        await serving
