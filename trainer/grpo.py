"""One policy update on one batch: GRPO advantages and the PPO-clip objective, in torch.

A sample is its prompt and turns: model turns carry the behaviour logprobs the worker
sampled them with (the distribution after temperature, as both engines report), and
observations are context only. The loss runs over model tokens alone:

    ratio_t = exp(logp_new(t) - logp_behaviour(t))
    loss    = -mean_t min(ratio_t * A, clip(ratio_t, 1 - eps, 1 + eps) * A)

with A the sample's advantage: group-normalised (GRPO: reward minus its group's mean,
over the group's standard deviation) or batch-baselined (`advantages="batch"`: reward
minus the batch mean, no critic). `logp_new` is computed at the temperature the sample
was drawn with, so on the first pass ratio = 1 up to numerics, which is what the
logprob check in the tests measures. Samples delivered failed are masked: they count
in no group statistic and carry no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from cadence.worker.api import Delivery


@dataclass(frozen=True, slots=True)
class Scored:
    """A delivered sample with its group and reward."""

    group: int
    delivery: Delivery
    reward: float


@dataclass(frozen=True, slots=True)
class UpdateConfig:
    clip_eps: float = 0.2
    epochs: int = 1  # passes over the batch
    advantages: Literal["group", "batch"] = "group"
    max_grad_norm: float = 1.0


@dataclass(frozen=True, slots=True)
class UpdateStats:
    samples: int
    masked: int
    tokens: int
    mean_reward: float
    loss: float
    clipped_share: float
    # First pass, samples of the version being trained only (older ones differ by
    # design): the trainer's logprobs against the worker's behaviour logprobs.
    max_abs_logprob_diff: float
    mean_abs_logprob_diff: float


def advantages(batch: Sequence[Scored], kind: Literal["group", "batch"]) -> list[float]:
    """One advantage per sample; 0 for masked (failed) samples."""
    live = [s for s in batch if not s.delivery.failed]
    if kind == "batch":
        mean = sum(s.reward for s in live) / len(live) if live else 0.0
        return [0.0 if s.delivery.failed else s.reward - mean for s in batch]
    groups: dict[int, list[float]] = {}
    for s in live:
        groups.setdefault(s.group, []).append(s.reward)
    out = []
    for s in batch:
        rewards = groups.get(s.group, [])
        if s.delivery.failed or len(rewards) < 2:
            out.append(0.0)
            continue
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        out.append((s.reward - mean) / (std + 1e-6))
    return out


def sequence(delivery: Delivery) -> tuple[list[int], list[float | None]]:
    """All tokens of a sample, and for each token its behaviour logprob (None for the
    prompt and observations, which are not trained on)."""
    ids = list(delivery.prompt_token_ids)
    behaviour: list[float | None] = [None] * len(ids)
    for turn in delivery.turns:
        ids += turn.token_ids
        if turn.role == "model" and turn.logprobs is not None:
            behaviour += turn.logprobs
        else:
            behaviour += [None] * len(turn.token_ids)
    return ids, behaviour


def token_logprobs(model: Any, ids: list[int], temperature: float) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 under `model`, at the sampling temperature
    (greedy samples are scored at temperature 1, as the workers report them)."""
    logits = model(torch.tensor([ids])).logits[0, :-1].float()
    if temperature > 0:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batch: Sequence[Scored],
    config: UpdateConfig,
    version: int | None = None,
) -> UpdateStats:
    """One update of `model` (serving `version`, if known) on `batch`."""
    adv = advantages(batch, config.advantages)
    live = [(s, a) for s, a in zip(batch, adv, strict=True) if not s.delivery.failed]
    model.train()
    total_loss, clipped, tokens, max_diff, sum_diff, compared = 0.0, 0, 0, 0.0, 0.0, 0
    for epoch in range(config.epochs):
        optimizer.zero_grad(set_to_none=True)
        n_tokens = sum(sum(b is not None for b in sequence(s.delivery)[1][1:]) for s, _ in live)
        for s, a in live:
            ids, behaviour = sequence(s.delivery)
            mask = torch.tensor([b is not None for b in behaviour[1:]])
            if not mask.any():
                continue
            old = torch.tensor([b if b is not None else 0.0 for b in behaviour[1:]])
            new = token_logprobs(model, ids, s.delivery.sampling.temperature)
            ratio = torch.exp(new - old)
            surrogate = torch.minimum(
                ratio * a, ratio.clamp(1 - config.clip_eps, 1 + config.clip_eps) * a
            )
            loss = -(surrogate * mask).sum() / max(1, n_tokens)
            loss.backward()  # type: ignore[no-untyped-call]
            if epoch == 0 and version in (None, s.delivery.version):
                diff = (new.detach() - old)[mask].abs()
                max_diff = max(max_diff, diff.max().item())
                sum_diff += diff.sum().item()
                compared += int(mask.sum())
            if epoch == 0:
                tokens += int(mask.sum())
            total_loss += float(loss.detach())
            outside = (ratio.detach() - 1).abs() > config.clip_eps
            clipped += int((outside & mask).sum())
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
    model.eval()
    rewards = [s.reward for s, _ in live]
    return UpdateStats(
        samples=len(batch),
        masked=len(batch) - len(live),
        tokens=tokens,
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        loss=total_loss / max(1, config.epochs),
        clipped_share=clipped / max(1, tokens * config.epochs),
        max_abs_logprob_diff=max_diff,
        mean_abs_logprob_diff=sum_diff / max(1, compared),
    )
