"""How a sample Cadence delivers becomes TRL's rollout sample (`integrations/trl/rollout.py`):
the model's tokens are trained on with their behaviour logprobs, an environment's are
context, the version is the oldest that generated a model turn, and advantages are TRL's
group-normalised ones over the scorable samples. A publish is asked again while the run
is unreachable, and one whose answer was lost is not published twice. No TRL needed."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from cadence.integrations.trl.rollout import group_advantages, tokens_of
from cadence.integrations.trl.weights import CadenceWeightTransfer
from cadence.trainer.api import BatchSample
from cadence.trainer.client import TrainerError
from cadence.worker.api import Delivery, Timings, Turn


def _sample(turns: list[Turn], version: int = 3) -> BatchSample:
    delivery = Delivery(
        id="s-1",
        attempt=0,
        version=version,
        worker_id="w0",
        prompt_token_ids=[5, 6],
        turns=turns,
        timings=Timings(),
        finished_at=0.0,
    )
    return BatchSample(id="s-1", group=0, version=version, failed=False, delivery=delivery)


def test_model_tokens_are_trained_with_their_logprobs_and_tool_output_is_context() -> None:
    sample = _sample(
        [
            Turn(role="model", token_ids=[7, 8], logprobs=[-0.5, -1.0], version=2),
            Turn(role="environment", token_ids=[9]),
            Turn(role="model", token_ids=[10], logprobs=[-0.25], version=3),
        ]
    )
    ids, mask, logprobs, version = tokens_of(sample)
    assert ids == [5, 6, 7, 8, 9, 10]
    assert mask == [0, 0, 1, 1, 0, 1]
    assert logprobs == [0.0, 0.0, -0.5, -1.0, 0.0, -0.25]
    assert version == 2  # the oldest policy that wrote any of its tokens


def test_advantages_are_trls_over_the_scorable_samples_of_a_group() -> None:
    advantages, mean, std = group_advantages([1.0, 0.0, float("nan"), 0.5])
    assert math.isclose(mean, 0.5) and math.isclose(std, float(np.std([1.0, 0.0, 0.5])))
    assert advantages[2] == 0.0  # unscorable: no push either way
    assert np.allclose(advantages[[0, 1, 3]], [(r - 0.5) / (std + 1e-8) for r in (1.0, 0.0, 0.5)])
    none, mean, _ = group_advantages([float("nan")] * 3)
    assert (none == 0.0).all() and math.isnan(mean)


def _transfer_against(
    tmp_path: Path, answers: list[httpx.Response | Exception], version: int
) -> tuple[CadenceWeightTransfer, list[str]]:
    asked: list[str] = []

    def serve(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.method} {request.url.path}")
        if request.url.path == "/v1/version":
            return httpx.Response(
                200, json={"version": version, "sha256": "ab", "weights_path": "/v1/weights/1"}
            )
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    transfer = CadenceWeightTransfer(
        "http://trainer",
        "token",
        tmp_path,
        retry_for_s=5.0,
        transport=httpx.MockTransport(serve),
    )
    transfer.init_weight_transfer()
    return transfer, asked


def test_a_publish_is_asked_again_and_an_answer_lost_on_the_way_is_found(
    tmp_path: Path,
) -> None:
    weights = [("w", torch.ones(2))]
    lost: list[httpx.Response | Exception] = [
        httpx.ConnectError("the trainer restarts"),
        httpx.Response(409, json={"error": "the next version is 2, not 1", "reason": "publish"}),
    ]
    transfer, asked = _transfer_against(tmp_path, lost, version=1)
    transfer.send_weights(iter(weights))  # the cold sync: the run serves it as version 0
    assert asked == []
    transfer.send_weights(iter(weights))
    assert asked == ["POST /v1/publish", "POST /v1/publish", "GET /v1/version"]
    assert [p.version for p in transfer.published] == [1]
    # A refusal that is not an earlier try of this version stays a refusal.
    refused: list[httpx.Response | Exception] = [
        httpx.Response(409, json={"error": "batch 1 is not complete", "reason": "publish"})
    ]
    transfer, _ = _transfer_against(tmp_path, refused, version=0)
    transfer.send_weights(iter(weights))
    with pytest.raises(TrainerError, match="batch 1 is not complete"):
        transfer.send_weights(iter(weights))
