"""TRL's rollout-worker seam, served by a Cadence run.

TRL's trainer reads `RolloutSample`s from `rollout_buffer` and never asks where they came
from. This worker submits the training prompts to a Cadence run in external-trainer mode,
waits for each batch whole (Cadence's staleness bound holds batch by batch), scores it with
the user's reward functions as TRL's own worker does (summed, `None` unscorable, advantages
normalised within each group over the scorable samples) and puts its samples on the buffer
in group order. Cadence's versions start at 0 with the initial weights; TRL's start at 1
after its first (cold) weight sync, so a sample TRL sees carries Cadence's version + 1."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import multiprocessing.queues
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import numpy as np

from cadence.integrations.trl.agreement import check_agreement
from cadence.trainer.api import BatchSample, RunSettings, SubmittedPrompt
from cadence.trainer.client import TrainerClient, TrainerError

RewardFunc = Callable[..., Sequence[float | None]]


def run_settings(url: str, token: str) -> RunSettings:
    """The settings of the Cadence run at `url` (from a synchronous caller)."""

    async def read() -> RunSettings:
        client = TrainerClient(url, token)
        try:
            return await client.settings()
        finally:
            await client.aclose()

    return asyncio.run(read())


def tokens_of(sample: BatchSample) -> tuple[list[int], list[int], list[float], int]:
    """(input ids, completion mask, old logprobs, oldest version) of a delivered sample:
    its prompt, then every turn; the model's tokens are trained on (mask 1, their
    behaviour logprobs), an environment's are context (mask 0)."""
    d = sample.delivery
    ids = list(d.prompt_token_ids)
    mask = [0] * len(ids)
    logprobs = [0.0] * len(ids)
    versions = []
    for turn in d.turns:
        ids += turn.token_ids
        if turn.role == "model":
            mask += [1] * len(turn.token_ids)
            logprobs += list(turn.logprobs or [0.0] * len(turn.token_ids))
            if turn.version is not None:
                versions.append(turn.version)
        else:
            mask += [0] * len(turn.token_ids)
            logprobs += [0.0] * len(turn.token_ids)
    return ids, mask, logprobs, min(versions, default=sample.version)


def group_advantages(rewards: Sequence[float]) -> tuple[np.ndarray, float, float]:
    """TRL's GRPO advantages for one group: (r - mean) / (std + 1e-8) over the scorable
    samples (NaN rewards get 0); with the group's mean and std."""
    r = np.asarray(rewards, dtype=float)
    scored = ~np.isnan(r)
    advantages = np.zeros_like(r)
    if not scored.any():
        return advantages, float("nan"), float("nan")
    mean, std = float(r[scored].mean()), float(r[scored].std())
    advantages[scored] = (r[scored] - mean) / (std + 1e-8)
    return advantages, mean, std


@dataclass
class CadenceRolloutWorker:
    """TRL's `RolloutWorkerProtocol` over a Cadence run (external-trainer mode).

    `dataset` rows are TRL's: a `prompt` (text, or chat messages the tokenizer's template
    renders) and any other columns, which reach the reward functions as keyword lists.
    Row `i % len(dataset)` is the prompt of Cadence group `i`."""

    url: str
    token: str
    dataset: Sequence[Mapping[str, Any]]
    reward_funcs: Sequence[RewardFunc]
    tokenizer: Any
    args: Any  # TRL's AsyncGRPOConfig
    world_size: int = 1
    poll_s: float = 0.2
    # TRL's protocol types them as either kind of queue; these are thread queues.
    rollout_buffer: queue.Queue[Any] | multiprocessing.queues.Queue[Any] = field(
        default_factory=queue.Queue
    )
    metrics_queue: queue.Queue[Any] | multiprocessing.queues.Queue[Any] = field(
        default_factory=queue.Queue
    )
    model_version: int = 0  # TRL's, as the trainer last said
    delivered: list[str] = field(default_factory=list)  # sample ids, in buffer order
    lags: list[int] = field(default_factory=list)  # TRL's version at delivery - the sample's
    settings: RunSettings | None = None
    _error: BaseException | None = None
    _heard_at: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        if not self.dataset:
            raise ValueError("the dataset has no rows: there is no prompt to submit")
        self.settings = run_settings(self.url, self.token)
        check_agreement(self.args, self.settings, self.world_size)

    # --- TRL's protocol -----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cadence-rollout", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RuntimeError(f"the Cadence rollout stopped: {self._error}") from self._error
        silent = time.monotonic() - self._heard_at
        if silent > stale_after_s:
            raise RuntimeError(
                f"the Cadence trainer at {self.url} has not answered for {silent:.0f} s"
            )

    # --- the rollout thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._rollout())
        except BaseException as e:
            self._error = e

    async def _rollout(self) -> None:
        assert self.settings is not None
        run = self.settings
        client = TrainerClient(self.url, self.token)
        total = run.iterations * run.batch_groups
        # The dataset streams in chunks, kept a few batches ahead of admission: any size
        # goes, and the run's ledger never holds the whole of it.
        submitting = asyncio.create_task(
            client.submit_all(
                (self._prompt(g) for g in range(total)),
                window=2 * (run.eta + 2) * run.batch_groups,
                poll_s=self.poll_s,
            )
        )
        try:
            last: list[Any] = []
            for u in range(run.iterations):
                batch = await self._batch(client, u, submitting)
                if batch is None:
                    return
                last = self._score(batch)
                for s in last:
                    self.rollout_buffer.put(s)
            await submitting
            self._read_ahead(last)
        finally:
            submitting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await submitting
            await client.aclose()

    def _read_ahead(self, last: list[Any]) -> None:
        """The data loader TRL trains through (accelerate's) reads one micro-batch ahead
        of the one it trains, so the last step waits on samples the run never makes.
        Copies of the last ones, with no advantage (no gradient, were they trained),
        fill that read; training stops at `max_steps`, before it trains them."""
        micro_batch = self.args.per_device_train_batch_size * self.world_size
        for s in last[:micro_batch]:
            self.rollout_buffer.put(replace(s, advantage=0.0, metrics={"read_ahead": 1.0}))

    async def _batch(
        self, client: TrainerClient, u: int, submitting: asyncio.Task[int]
    ) -> list[BatchSample] | None:
        while not self._stop.is_set():
            if submitting.done():
                submitting.result()  # a submission that failed ends the rollout with its error
            try:
                found = await client.batch(u, poll_s=self.poll_s, timeout_s=self.poll_s * 5)
            except httpx.TransportError:
                # The service is restarting or unreachable: asked again; `check_health`
                # fails TRL's run if it stays silent for TRL's `stale_after_s`.
                await asyncio.sleep(self.poll_s)
                continue
            except TrainerError as e:
                if e.reason != "incomplete":
                    raise
                self._heard_at = time.monotonic()  # it answered: the batch is not whole yet
                continue
            self._heard_at = time.monotonic()
            return found.samples
        return None

    def _row(self, group: int) -> Mapping[str, Any]:
        return self.dataset[group % len(self.dataset)]

    def _prompt(self, group: int) -> SubmittedPrompt:
        prompt = self._row(group)["prompt"]
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        return SubmittedPrompt(prompt_token_ids=list(ids))

    def _score(self, samples: list[BatchSample]) -> list[Any]:
        from trl.experimental.async_grpo.async_rollout_worker import (  # noqa: PLC0415
            RolloutSample,  # TRL is imported only where it is installed
        )

        groups: dict[int, list[BatchSample]] = {}
        for s in samples:
            groups.setdefault(s.group, []).append(s)
        out = []
        for g, members in groups.items():
            out += self._score_group(g, members, RolloutSample)
        self.metrics_queue.put(
            {"cadence/batch_samples": float(len(samples)), "cadence/lag_max": float(max(self.lags))}
        )
        return out

    def _score_group(
        self, group: int, members: list[BatchSample], rollout_sample: Any
    ) -> list[Any]:
        """TRL's `RolloutSample`s (`rollout_sample`, its class) of one group."""
        row = self._row(group)
        tokens = [tokens_of(s) for s in members]
        completion_ids = [
            [t for t, m in zip(ids, mask, strict=True) if m] for ids, mask, _, _ in tokens
        ]
        texts = [self.tokenizer.decode(c, skip_special_tokens=True) for c in completion_ids]
        conversational = not isinstance(row["prompt"], str)
        completions = [
            [{"role": "assistant", "content": t}] if conversational else t for t in texts
        ]
        extra = {k: [v] * len(members) for k, v in row.items() if k != "prompt"}
        kwargs = dict(
            prompts=[row["prompt"]] * len(members),
            completions=completions,
            completion_ids=completion_ids,
            **extra,
        )
        columns = [_call(f, kwargs) for f in self.reward_funcs]
        rewards = []
        for i, s in enumerate(members):
            values = [float(v) for v in (c[i] for c in columns) if v is not None]
            rewards.append(float("nan") if s.failed or not values else float(sum(values)))
        advantages, mean, std = group_advantages(rewards)
        scored = []
        for s, (ids, mask, logprobs, version), completion, reward, advantage in zip(
            members, tokens, completions, rewards, advantages, strict=True
        ):
            trl_version = version + 1
            self.lags.append(max(0, self.model_version - trl_version))
            self.delivered.append(s.id)
            scored.append(
                rollout_sample(
                    prompt=row["prompt"],
                    completion=completion,
                    input_ids=np.asarray(ids, dtype=np.int64),
                    completion_mask=np.asarray(mask, dtype=np.int64),
                    old_log_probs=np.asarray(logprobs, dtype=np.float32),
                    advantage=float(advantage),
                    model_version=trl_version,
                    group_id=group,
                    metrics={"reward": reward, "reward_std": std, "reward_mean": mean},
                )
            )
        return scored


def _call(func: RewardFunc, kwargs: dict[str, Any]) -> Sequence[float | None]:
    if inspect.iscoroutinefunction(func):
        raise TypeError(f"reward function {func.__name__} is async; give a plain function")
    return func(**kwargs)
