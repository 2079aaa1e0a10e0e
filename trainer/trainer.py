"""The trainer without HTTP: admission from the dataset cursor, ingest with rewards, one
update per complete batch, publishing, and resuming from the ledger.

Exactly once: a batch is trained only when the ledger says it is next and complete, the
new version's weights and the optimizer's state are written (atomically) before the
ledger records the batch consumed and the version published, in one transaction. A
trainer that dies in between restarts from the ledger's version, whose weights and
optimizer state are on disk, and trains the batch again from the same point: the
half-finished version it wrote is overwritten, never served as published.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load
from transformers import AutoModelForCausalLM

from cadence.common.statelock import StateLock
from cadence.common.tensors import WeightsMismatch, load_weights
from cadence.common.vocabulary import Vocabulary
from cadence.trainer.config import TrainerConfig
from cadence.trainer.grpo import (
    Scored,
    UpdateConfig,
    UpdateStats,
    sequence,
    token_logprobs,
    update,
)
from cadence.trainer.ledger import Accepted, Group, Ledger, LedgerError
from cadence.trainer.task import TASKS
from cadence.trainer.weights import WeightStore, load_optimizer, save_optimizer
from cadence.worker.api import Delivery

log = logging.getLogger("cadence.trainer")


class Trainer:
    def __init__(self, config: TrainerConfig) -> None:
        self.config = config
        self.external = config.task == "external"
        self.task = TASKS["digits" if self.external else config.task]
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_lock = StateLock(
            config.state_dir,
            f"the trainer state directory {config.state_dir}",
            note="trainer.lock",
        )
        try:
            self._load(config)
        except BaseException:
            self.state_lock.release()  # a start that fails leaves the directory free
            raise

    def _load(self, config: TrainerConfig) -> None:
        """The state directory checked and loaded, the model at the ledger's version."""
        self.ledger = _open_ledger(config)
        self.ledger.guard = self.state_lock.check
        self.store = WeightStore(config.state_dir / "weights", guard=self.state_lock.check)
        _check_agreement(self.ledger, self.store, config, external=self.external)
        self.vocabulary = Vocabulary(config.model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=torch.float32)
        self.model: Any = model.eval()
        torch.manual_seed(config.seed)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.learning_rate)
        self.vocab_size = int(self.model.config.vocab_size)
        self.lock = threading.Lock()  # the ledger's connection is used from two threads
        self.model_lock = threading.Lock()  # the model between an update and its publication
        # Why the last update failed, until one succeeds: the trainer's health says so.
        self.broken: str | None = None
        version = self.ledger.version
        if version == 0:
            self.store.publish(self.model, 0)
        else:
            self.store.load_into(self.model, version)
            if not self.external:  # an external trainer keeps its own optimizer
                load_optimizer(self.optimizer, self.model, self._optimizer_path(version))
        self.store.retain(self._kept())
        self._prompts = self.task.prompts(config.seed)
        for _ in range(self.ledger.cursor):  # the stream resumes where admission stopped
            next(self._prompts)

    def _optimizer_path(self, version: int) -> Path:
        return self.config.state_dir / "weights" / f"optimizer-v{version}.safetensors"

    def _kept(self) -> set[int]:
        """Versions bound to an unfinished sample, and the newest `eta + 1`: a worker of
        any of those may still start fresh samples (the staleness bound allows it), so a
        replacement worker can be sent to one of them."""
        newest = self.ledger.version
        window = range(max(0, newest - self.config.eta), newest + 1)
        return self.ledger.versions_in_use() | set(window)

    @property
    def total_groups(self) -> int:
        return self.config.iterations * self.config.batch_groups

    # --- admission and ingest ----------------------------------------------------------

    def admission_limit(self) -> int:
        """Groups the staleness bound allows now (docs/architecture.md): k < (v + eta + 1) * B."""
        bound = (self.ledger.version + self.config.eta + 1) * self.config.batch_groups
        return min(bound, self.total_groups)

    def admit(self, groups: int) -> list[Group]:
        with self.lock:
            room = max(0, self.admission_limit() - self.ledger.cursor)
            admitted = []
            for _ in range(min(groups, room)):
                if self.external:
                    queued = self.ledger.submitted(self.ledger.cursor)
                    if queued is None:
                        break  # admission waits for the external trainer's prompts
                    admitted.append(self.ledger.admit(*queued))
                    continue
                prompt = next(self._prompts)
                admitted.append(
                    self.ledger.admit(self.vocabulary.encode(prompt.text), prompt.answer)
                )
            return admitted

    def reward(self, delivery: Delivery, answer: str) -> float:
        if delivery.failed or self.external:  # an external trainer scores its own samples
            return 0.0
        text = self.vocabulary.decode(
            [t for turn in delivery.turns if turn.role == "model" for t in turn.token_ids]
        )
        return self.task.score(text, answer)

    def ingest(self, delivery: Delivery) -> tuple[Accepted, float | None, str]:
        """(outcome, reward, why): `why` says what is wrong with an invalid delivery."""
        with self.lock:
            try:
                sample = self.ledger.sample(delivery.id)
            except ValueError:
                return "unknown", None, ""
            group = self.ledger.group(sample.group)
            ended = sample.state in ("delivered", "consumed")
            # Only what would be accepted is checked; stale and repeated ones say so.
            why = (
                self.invalid(delivery, group)
                if sample.attempt == delivery.attempt and not ended
                else ""
            )
            if why:
                self.ledger.refuse(delivery)
                return "invalid", None, why
            reward = self.reward(delivery, group.answer)
            return self.ledger.deliver(delivery, reward), reward, ""

    def invalid(self, delivery: Delivery, group: Group) -> str:
        """Why this delivery cannot be trained on (empty if it can): it must carry the
        admitted prompt, and token ids the model embeds. (Finite logprobs, one per
        generated token, the API's models check.)"""
        if delivery.prompt_token_ids != group.prompt:
            return f"{delivery.id}: the prompt is not the one admitted for group {group.index}"
        vocab = self.vocab_size
        worst = max((t for turn in delivery.turns for t in turn.token_ids), default=-1)
        if worst >= vocab:
            return f"{delivery.id}: token id {worst} is outside the model's vocabulary ({vocab})"
        return ""

    # --- training -----------------------------------------------------------------------

    def ready(self) -> bool:
        if self.external:
            return False
        with self.lock:
            u = self.ledger.consumed_batches
            return u < self.config.iterations and self.complete(u)

    def complete(self, u: int) -> bool:
        """Whether batch `u` can be trained now (the caller holds the lock); under
        `oldest_complete` batching, it becomes the B groups that completed first."""
        if self.config.batches == "oldest_complete":
            return self.ledger.take_oldest_complete(u)
        return self.ledger.batch_complete(u)

    def train_next(self) -> UpdateStats | None:
        """Train the next batch if it is complete; publish its version. Blocking."""
        config = UpdateConfig(
            clip_eps=self.config.clip_eps,
            epochs=self.config.epochs,
            advantages=self.config.advantages,
        )
        with self.model_lock:  # checked and trained as one step, as publish_external is
            with self.lock:
                u = self.ledger.consumed_batches
                if u >= self.config.iterations or not self.complete(u):
                    return None
                batch = [Scored(s.group, d, s.reward or 0.0) for s, d in self.ledger.deliveries(u)]
            started = time.perf_counter()
            stats = self._update(u, batch, config)
            self.store.publish(self.model, u + 1)
            save_optimizer(self.optimizer, self.model, self._optimizer_path(u + 1))
            # The update's wall time (train, publish, save) goes with its statistics: the
            # simulator takes it as the trainer's cost (`cadence bench agreement`).
            recorded = {**dataclasses.asdict(stats), "seconds": time.perf_counter() - started}
            with self.lock:
                self.ledger.consume(u, u + 1, json.dumps(recorded))
                self.store.retain(self._kept())
                for old in range(u + 1):
                    self._optimizer_path(old).unlink(missing_ok=True)
        return stats

    def published(self, version: int) -> bool:
        """Whether `version` is on disk; the current one is written again from the model
        in memory if it went missing (its directory deleted under the running trainer),
        so the pool is never left without the weights it must advance to."""
        if self.store.has(version):
            return True
        with self.model_lock:
            if version != self.ledger.version or self.store.has(version):
                return self.store.has(version)
            log.warning("the weights of version %d went missing; writing them again", version)
            self.store.publish(self.model, version)
            if not self.external:
                save_optimizer(self.optimizer, self.model, self._optimizer_path(version))
        return True

    def _update(self, u: int, batch: list[Scored], config: UpdateConfig) -> UpdateStats:
        """Train batch `u`. If the update fails (raises, or its loss is not finite), the
        model and optimizer go back to version `u`, the samples the model cannot score
        are marked failed (masked), and the update runs once more without them; if that
        fails too, `broken` says why and the error goes up."""
        try:
            return _finite(update(self.model, self.optimizer, batch, config, version=u))
        except Exception as first:
            self._restore(u)
            bad = [s.delivery.id for s in batch if not s.delivery.failed and not self._scores(s)]
            if not bad:
                self.broken = f"update {u} failed: {first!r}"
                raise
            with self.lock:
                self.ledger.mark_failed(bad)
                batch = [Scored(s.group, d, s.reward or 0.0) for s, d in self.ledger.deliveries(u)]
        try:
            return _finite(update(self.model, self.optimizer, batch, config, version=u))
        except Exception as second:
            self._restore(u)
            self.broken = f"update {u} failed without its {len(bad)} bad samples: {second!r}"
            raise

    def _restore(self, version: int) -> None:
        """The model and optimizer as version `version` left them (on disk)."""
        self.store.load_into(self.model, version)
        if version > 0:
            load_optimizer(self.optimizer, self.model, self._optimizer_path(version))
        else:
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(), lr=self.config.learning_rate
            )

    @torch.no_grad()
    def _scores(self, s: Scored) -> bool:
        """Whether the model gives finite logprobs for this sample's tokens."""
        ids, _ = sequence(s.delivery)
        try:
            scored = token_logprobs(self.model, ids, s.delivery.sampling.temperature)
        except Exception:
            return False
        return bool(torch.isfinite(scored).all())

    def publish_external(self, version: int, data: bytes, sha256: str) -> None:
        """An external trainer's update of batch `version - 1`: its weights (checked, loaded
        to prove they fit the model) become `version`, and the batch is consumed.

        One step under the model's lock: checked, loaded, written and recorded together,
        so a concurrent publish of the same version is refused before it touches the
        model or the files, and a refused one leaves the accepted weights served."""
        if hashlib.sha256(data).hexdigest() != sha256:
            raise LedgerError(f"the weights' sha256 is not {sha256}")
        with self.model_lock:
            with self.lock:
                u = self.ledger.consumed_batches
                if version != u + 1:
                    raise LedgerError(f"the next version is {u + 1}, not {version}")
                if not self.complete(u):
                    raise LedgerError(f"batch {u} is not complete")
            try:
                load_weights(self.model, load(data))
            except Exception as e:
                self.store.load_into(self.model, u)  # a tensor may have been half copied
                if isinstance(e, WeightsMismatch):
                    raise LedgerError(str(e)) from None
                raise LedgerError(f"the weights do not fit the model: {e}") from None
            self.store.publish(self.model, version)
            with self.lock:
                self.ledger.consume(u, version, json.dumps({"external": True}))
                self.store.retain(self._kept())

    def reward_by_version(self) -> dict[int, float]:
        """Mean reward of the samples each version generated, oldest first."""
        with self.lock:
            return self.ledger.reward_by_version()


class StateDamaged(RuntimeError):
    """The state directory cannot be trusted: a damaged ledger, or a ledger and weights
    that disagree. The trainer refuses to start rather than serve version 0 beside a
    newer policy, or train on a ledger it cannot read."""


def _open_ledger(config: TrainerConfig) -> Ledger:
    path = config.state_dir / "ledger.db"
    try:
        ledger = Ledger(path, group_size=config.group_size, batch_groups=config.batch_groups)
        check = ledger.db.execute("PRAGMA quick_check").fetchone()
    except sqlite3.DatabaseError as e:
        raise StateDamaged(
            f"the ledger {path} is damaged ({e}); restore it from a backup"
        ) from None
    if check is None or check[0] != "ok":
        ledger.close()
        raise StateDamaged(f"the ledger {path} fails its integrity check ({check and check[0]})")
    return ledger


def _check_agreement(
    ledger: Ledger, store: WeightStore, config: TrainerConfig, *, external: bool
) -> None:
    """The ledger's version must be the newest published one, whole (its sha256 holds),
    with the optimizer state that goes with it."""
    version, published = ledger.version, store.versions()
    where = config.state_dir
    if version > 0 and version + 1 in published:
        # An update published its weights and died before the ledger recorded it: the
        # batch is trained again, so its weights go.
        log.warning("removing version %d, published but never recorded", version + 1)
        store.remove(version + 1)
        published.remove(version + 1)
    newest = max(published, default=0)
    if newest > version:
        raise StateDamaged(
            f"the ledger in {where} is at version {version} but its weights go up to "
            f"version {newest}: the ledger was lost or replaced; restore it, or start "
            "from an empty state directory"
        )
    if version == 0:
        return
    if not store.has(version):
        raise StateDamaged(
            f"the ledger in {where} is at version {version} but {store.path(version)} "
            "or its sha256 is missing"
        )
    digest = hashlib.sha256(store.path(version).read_bytes()).hexdigest()
    if digest != store.sha256(version):
        raise StateDamaged(f"{store.path(version)} does not match its sha256")
    optimizer = config.state_dir / "weights" / f"optimizer-v{version}.safetensors"
    if not external and not optimizer.is_file():
        raise StateDamaged(f"the optimizer state of version {version} ({optimizer}) is missing")


def _finite(stats: UpdateStats) -> UpdateStats:
    """An update whose loss came out NaN or infinite has spoilt the weights."""
    if not math.isfinite(stats.loss):
        raise FloatingPointError(f"the update's loss is {stats.loss}")
    return stats
