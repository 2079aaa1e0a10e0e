"""Trainer factories: deliveries as a worker would send them."""

from __future__ import annotations

from collections.abc import Sequence

from cadence.worker.api import Delivery, Sampling, Timings, Turn


def delivery(
    sid: str,
    *,
    attempt: int = 0,
    version: int = 0,
    prompt: Sequence[int] = (1, 2, 3),
    tokens: Sequence[int] = (4, 5),
    logprobs: Sequence[float] | None = None,
    failed: bool = False,
    temperature: float = 1.0,
) -> Delivery:
    turn = Turn(
        role="model",
        token_ids=list(tokens),
        logprobs=list(logprobs) if logprobs is not None else [-1.0] * len(tokens),
        version=version,
    )
    return Delivery(
        id=sid,
        attempt=attempt,
        version=version,
        worker_id="w0",
        prompt_token_ids=list(prompt),
        turns=[turn],
        timings=Timings(),
        finished_at=0.0,
        sampling=Sampling(temperature=temperature),
        failed=failed,
    )
