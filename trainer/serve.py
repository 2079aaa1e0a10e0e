"""`cadence trainer`: the trainer service as a process, as its pod runs it. Its state
(ledger, published weights, optimizer state) lives in `--state-dir`, a volume in
Kubernetes; a restarted trainer resumes from it (`Trainer`). Given a certificate and key
(`--tls-cert`, `--tls-key`) it serves HTTPS only: its pod binds 0.0.0.0, and the pool's
bearer token rides in every request."""

from __future__ import annotations

from pathlib import Path

import uvicorn

from cadence.common import web
from cadence.trainer.app import create_app
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer


def serve(
    config: TrainerConfig,
    token: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8100,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    listen_fd: int | None = None,
) -> None:
    sockets = web.inherited_sockets(listen_fd)
    trainer = Trainer(config)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(trainer, token),
            host=host,
            port=port,
            log_level="info",
            http=web.http_protocol(),
            ssl_certfile=tls_cert,
            ssl_keyfile=tls_key,
        )
    )
    server.run(sockets=sockets)
