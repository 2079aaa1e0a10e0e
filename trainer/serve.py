"""`cadence trainer`: the trainer service as a process, as its pod runs it. Its state
(ledger, published weights, optimizer state) lives in `--state-dir`, a volume in
Kubernetes; a restarted trainer resumes from it (`Trainer`)."""

from __future__ import annotations

import uvicorn

from cadence.trainer.app import create_app
from cadence.trainer.config import TrainerConfig
from cadence.trainer.trainer import Trainer


def serve(config: TrainerConfig, token: str, *, host: str = "127.0.0.1", port: int = 8100) -> None:
    trainer = Trainer(config)
    uvicorn.run(create_app(trainer, token), host=host, port=port, log_level="info")
