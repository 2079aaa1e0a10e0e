"""The ledger: the dataset cursor and every admitted sample's record, in SQLite.

It is the one durable account of the rollout (docs/architecture.md, "Ledger"): everything else (the
control loop's view, the workers' residents) can be rebuilt from it and from the
workers. Each sample has one current attempt; only that attempt's delivery is accepted,
once. A sample the ledger shows in flight that no worker holds is re-queued from its
prompt, fresh and unbound, under the next attempt. A batch is consumed exactly once, in
the same transaction that records the version its update published, so a trainer that
dies between training and committing trains that batch again from the same weights,
and never twice into the published line.

States: `fresh` (admitted, not started, unbound), `placed` (resident on `worker`),
`parked` (departed, token state on `worker`), `environment` (parked on `worker`, waiting
for its observation), `delivered` (finished; the delivery is stored), `consumed`.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cadence.trainer.api import SampleState, sample_id
from cadence.worker.api import Delivery, Timings

IN_FLIGHT: tuple[SampleState, ...] = ("placed", "parked", "environment")
Accepted = Literal["accepted", "duplicate", "stale", "unknown", "invalid"]
# A sample re-queued this many times for its own fault (its placement refused as
# invalid, its decode step failed, its delivery refused; a lost worker does not count)
# ends failed instead: masked in training, never placed again, so an input no worker can
# decode cannot cycle for ever.
MAX_REQUEUES = 8

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS groups (
    grp INTEGER PRIMARY KEY,
    prompt TEXT NOT NULL,          -- JSON list of token ids
    answer TEXT NOT NULL           -- what the verifier checks against
);
CREATE TABLE IF NOT EXISTS samples (
    id TEXT PRIMARY KEY,
    grp INTEGER NOT NULL REFERENCES groups(grp),
    batch INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    state TEXT NOT NULL,
    worker TEXT,
    version INTEGER,               -- bound when it first starts decoding
    reward REAL,
    failed INTEGER NOT NULL DEFAULT 0,
    delivery TEXT,                 -- the accepted Delivery, JSON
    requeues INTEGER NOT NULL DEFAULT 0,  -- re-queues that were the sample's fault
    rev INTEGER NOT NULL DEFAULT 0  -- the change that last moved it (`changed_since`)
);
CREATE TABLE IF NOT EXISTS submitted (  -- prompts an external trainer sent, in order
    seq INTEGER PRIMARY KEY,
    prompt TEXT NOT NULL,
    answer TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS updates (version INTEGER PRIMARY KEY, stats TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS arrivals (  -- every delivery that reached the trainer, in order
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,         -- accepted, duplicate, stale, unknown, invalid
    tokens INTEGER NOT NULL,       -- tokens the model generated
    finished_at REAL NOT NULL,     -- wall clock, seconds
    latency_s REAL                 -- first decoding step to finish (monotonic)
);
CREATE INDEX IF NOT EXISTS samples_by_batch ON samples (batch, state);
CREATE INDEX IF NOT EXISTS samples_by_state ON samples (state, worker);
"""


class LedgerError(ValueError):
    """A request the ledger's rules forbid; the message is one sentence."""


class UnknownSample(LedgerError):
    """No sample by that id was ever admitted."""


@dataclass(frozen=True, slots=True)
class Sample:
    id: str
    group: int
    batch: int
    attempt: int
    state: SampleState
    worker: str | None
    version: int | None
    reward: float | None
    failed: bool


@dataclass(frozen=True, slots=True)
class Group:
    index: int
    prompt: list[int]
    answer: str


def _nothing() -> None:
    pass


class Ledger:
    def __init__(self, path: Path | str, *, group_size: int, batch_groups: int) -> None:
        """Open (or create) the ledger at `path`. A ledger remembers its shape: opening it
        with another group size or batch size is refused."""
        # One connection; callers serialise access (the trainer holds a lock around it).
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        # Called before every write transaction: the owner's check that it still holds
        # the directory (`StateLock.check`); it raises to refuse the write.
        self.guard: Callable[[], None] = _nothing
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        columns = {str(r[1]) for r in self.db.execute("PRAGMA table_info(samples)")}
        if "requeues" not in columns:  # a ledger written before the column existed
            self.db.execute("ALTER TABLE samples ADD COLUMN requeues INTEGER NOT NULL DEFAULT 0")
        if "rev" not in columns:
            self.db.execute("ALTER TABLE samples ADD COLUMN rev INTEGER NOT NULL DEFAULT 0")
        self.db.execute("CREATE INDEX IF NOT EXISTS samples_by_rev ON samples (rev)")
        shape = {"group_size": str(group_size), "batch_groups": str(batch_groups)}
        with self._tx():
            for key, value in shape.items():
                stored = self._meta(key)
                if stored is None:
                    self._set(key, value)
                elif stored != value:
                    raise LedgerError(f"the ledger at {path} has {key} {stored}, not {value}")
            if self._meta("epoch") is None:
                self._set("epoch", secrets.token_hex(8))
            if self._meta("cursor") is None:
                self._set("cursor", "0")
                self._set("version", "0")
                self._set("consumed", "0")  # batches consumed so far
        self.group_size = group_size
        self.batch_groups = batch_groups

    def close(self) -> None:
        self.db.close()

    # --- plumbing --------------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[None]:
        self.guard()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _next_rev(self) -> int:
        """The stamp of a change to samples' states (inside its transaction): read from
        the rows, so a rolled-back change leaves no gap a reader could have seen."""
        return self.rev + 1

    def _int(self, key: str) -> int:
        value = self._meta(key)
        assert value is not None
        return int(value)

    # --- the cursor and versions -------------------------------------------------------

    @property
    def cursor(self) -> int:
        """Groups admitted so far (the next group's number)."""
        return self._int("cursor")

    @property
    def version(self) -> int:
        """The newest published version."""
        return self._int("version")

    @property
    def consumed_batches(self) -> int:
        return self._int("consumed")

    def admit(self, prompt: Sequence[int], answer: str) -> Group:
        """Admit the next group: `group_size` fresh samples of one prompt."""
        with self._tx():
            k = self._int("cursor")
            self.db.execute(
                "INSERT INTO groups (grp, prompt, answer) VALUES (?, ?, ?)",
                (k, json.dumps(list(prompt)), answer),
            )
            rev = self._next_rev()
            self.db.executemany(
                "INSERT INTO samples (id, grp, batch, attempt, state, rev) "
                "VALUES (?, ?, ?, 0, 'fresh', ?)",
                [(sample_id(k, i), k, k // self.batch_groups, rev) for i in range(self.group_size)],
            )
            self._set("cursor", str(k + 1))
        return Group(k, list(prompt), answer)

    def submit(self, prompts: Sequence[tuple[Sequence[int], str]], first: int | None = None) -> int:
        """Queue prompts (token ids, answer) for admission; returns how many are queued.
        With `first`, they are prompts `first`, `first + 1`, ...: those queued already
        are skipped, and a `first` past the end is refused (it would leave a gap)."""
        with self._tx():
            start = self.queued()
            if first is not None and first > start:
                raise LedgerError(f"prompts up to #{start - 1} are queued; #{first} leaves a gap")
            skip = 0 if first is None else start - first
            self.db.executemany(
                "INSERT INTO submitted (seq, prompt, answer) VALUES (?, ?, ?)",
                [(start + i, json.dumps(list(p)), a) for i, (p, a) in enumerate(prompts[skip:])],
            )
            return self.queued()

    def queued(self) -> int:
        """Prompts submitted so far."""
        row = self.db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM submitted").fetchone()
        return int(row[0])

    def submitted(self, seq: int) -> tuple[list[int], str] | None:
        """The `seq`-th submitted prompt, if it has been submitted."""
        row = self.db.execute(
            "SELECT prompt, answer FROM submitted WHERE seq = ?", (seq,)
        ).fetchone()
        return None if row is None else (json.loads(row[0]), str(row[1]))

    def group(self, index: int) -> Group:
        row = self.db.execute(
            "SELECT prompt, answer FROM groups WHERE grp = ?", (index,)
        ).fetchone()
        if row is None:
            raise LedgerError(f"group {index} was never admitted")
        return Group(index, json.loads(row[0]), str(row[1]))

    # --- samples -------------------------------------------------------------------------

    def sample(self, sid: str) -> Sample:
        row = self.db.execute(
            "SELECT id, grp, batch, attempt, state, worker, version, reward, failed "
            "FROM samples WHERE id = ?",
            (sid,),
        ).fetchone()
        if row is None:
            raise UnknownSample(f"sample {sid} was never admitted")
        return _sample(row)

    def samples(self, *states: SampleState) -> list[Sample]:
        query = (
            "SELECT id, grp, batch, attempt, state, worker, version, reward, failed FROM samples"
        )
        if states:
            query += f" WHERE state IN ({', '.join('?' * len(states))})"
        return [_sample(r) for r in self.db.execute(query + " ORDER BY grp, id", states)]

    def listed(
        self, *states: SampleState
    ) -> list[tuple[str, int, int, SampleState, str | None, int | None]]:
        """(id, group, attempt, state, worker, version) of every sample in `states`, in
        the order `samples` gives: the control loop's view lists tens of thousands every
        period, and building a `Sample` of each was most of the time it took."""
        marks = ", ".join("?" * len(states))
        query = (
            "SELECT id, grp, attempt, state, worker, version FROM samples "
            f"WHERE state IN ({marks}) ORDER BY grp, id"
        )
        return self.db.execute(query, states).fetchall()

    @property
    def epoch(self) -> str:
        """This ledger's identity, made when it was created: a reader that kept a copy
        from `changed_since` knows by it that the ledger is the one it copied."""
        value = self._meta("epoch")
        assert value is not None
        return value

    @property
    def rev(self) -> int:
        """The stamp of the latest change to any sample's state, attempt or worker."""
        return int(self.db.execute("SELECT COALESCE(MAX(rev), 0) FROM samples").fetchone()[0])

    def changed_since(
        self, rev: int
    ) -> list[tuple[str, int, int, SampleState, str | None, int | None]]:
        """`listed`'s rows of every sample changed after `rev`, in any state (a sample
        delivered since shows as delivered): what a reader that copied the ledger at
        `rev` must apply to be current. The control loop reads this every period instead
        of tens of thousands of unchanged rows."""
        return self.db.execute(
            "SELECT id, grp, attempt, state, worker, version FROM samples WHERE rev > ? "
            "ORDER BY grp, id",
            (rev,),
        ).fetchall()

    def record(
        self,
        sid: str,
        attempt: int,
        state: SampleState,
        *,
        worker: str | None = None,
        version: int | None = None,
    ) -> bool:
        """Record where `sid` is now (placed/parked/environment) under `attempt`. A newer
        attempt replaces the current one (the control loop records a placement before
        it makes it, so a delivery from that attempt is never refused as stale); an older
        attempt's news, or news about a finished sample, is ignored: False."""
        return self.record_many([(sid, attempt, state, worker, version)]) == 1

    def record_many(
        self, records: Sequence[tuple[str, int, SampleState, str | None, int | None]]
    ) -> int:
        """`record` for many samples (id, attempt, state, worker, version) in one
        transaction; returns how many were taken."""
        for r in records:
            if r[2] not in IN_FLIGHT:
                raise LedgerError(f"record() takes an in-flight state, not {r[2]!r}")
        taken = 0
        with self._tx():
            for r in records:
                self.sample(r[0])  # an unknown id refuses the whole call
            rev = self._next_rev()
            for sid, attempt, state, worker, version in records:
                cur = self.db.execute(
                    "UPDATE samples SET state = ?, worker = ?, version = COALESCE(version, ?), "
                    "attempt = ?, rev = ? WHERE id = ? AND attempt <= ? AND state IN ('fresh', "
                    "'placed', 'parked', 'environment')",
                    (state, worker, version, attempt, rev, sid, attempt),
                )
                taken += cur.rowcount
        return taken

    def requeue(self, sid: str, now: float = 0.0, *, charged: bool = True) -> int:
        """Back to fresh and unbound under the next attempt (its partial output is gone);
        returns the new attempt. A delivered or consumed sample is not re-queued. The
        MAX_REQUEUES-th `charged` re-queue (the sample's fault, not its worker's) ends the
        sample instead: delivered, failed, empty."""
        with self._tx():
            s = self.sample(sid)
            if s.state in ("delivered", "consumed"):
                raise LedgerError(f"sample {sid} is {s.state}; it is not re-queued")
            row = self.db.execute("SELECT requeues FROM samples WHERE id = ?", (sid,)).fetchone()
            if charged and int(row[0]) + 1 >= MAX_REQUEUES:
                self._end_failed(s, now)
                return s.attempt + 1
            self.db.execute(
                "UPDATE samples SET state = 'fresh', worker = NULL, version = NULL, "
                "attempt = attempt + 1, requeues = requeues + ?, rev = ? WHERE id = ?",
                (int(charged), self._next_rev(), sid),
            )
        return s.attempt + 1

    def _end_failed(self, s: Sample, now: float) -> None:
        version = s.version if s.version is not None else self._int("version")
        ended = Delivery(
            id=s.id,
            attempt=s.attempt + 1,
            version=version,
            worker_id="ledger",
            prompt_token_ids=self.group(s.group).prompt,
            turns=[],
            timings=Timings(),
            finished_at=now,
            failed=True,
        )
        self.db.execute(
            "UPDATE samples SET state = 'delivered', worker = NULL, version = ?, reward = 0, "
            "failed = 1, attempt = ?, requeues = requeues + 1, delivery = ?, rev = ? WHERE id = ?",
            (version, s.attempt + 1, ended.model_dump_json(), self._next_rev(), s.id),
        )

    def refuse(self, delivery: Delivery) -> None:
        """Log an arrival the trainer refused as invalid (it is not delivered)."""
        with self._tx():
            self.db.execute(
                "INSERT INTO arrivals (id, attempt, outcome, tokens, finished_at, latency_s) "
                "VALUES (?, ?, 'invalid', ?, ?, NULL)",
                (
                    delivery.id,
                    delivery.attempt,
                    sum(len(t.token_ids) for t in delivery.turns if t.role == "model"),
                    delivery.finished_at,
                ),
            )

    def mark_failed(self, ids: Sequence[str]) -> None:
        """Delivered samples that cannot be trained on: masked from now on (reward 0)."""
        with self._tx():
            self.db.executemany(
                "UPDATE samples SET failed = 1, reward = 0 WHERE id = ? AND state = 'delivered'",
                [(i,) for i in ids],
            )

    def deliver(self, delivery: Delivery, reward: float) -> Accepted:
        """Accept a finished sample from its current attempt, once. Every arrival is
        logged with its outcome, so a run can show that none was accepted twice."""
        with self._tx():
            outcome = self._accept(delivery, reward)
            # Summed on the workers' monotonic clocks (`Timings.elapsed_s`), never a
            # difference of two wall clocks: a clock that jumps changes no latency.
            first = delivery.timings.first_step_at
            latency = delivery.timings.elapsed_s if first is not None else None
            self.db.execute(
                "INSERT INTO arrivals (id, attempt, outcome, tokens, finished_at, latency_s) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    delivery.id,
                    delivery.attempt,
                    outcome,
                    sum(len(t.token_ids) for t in delivery.turns if t.role == "model"),
                    delivery.finished_at,
                    latency,
                ),
            )
        return outcome

    def _accept(self, delivery: Delivery, reward: float) -> Accepted:
        row = self.db.execute(
            "SELECT attempt, state FROM samples WHERE id = ?", (delivery.id,)
        ).fetchone()
        if row is None:
            return "unknown"
        attempt, state = int(row[0]), str(row[1])
        if state in ("delivered", "consumed"):
            return "duplicate" if attempt == delivery.attempt else "stale"
        if attempt != delivery.attempt:
            return "stale"
        self.db.execute(
            "UPDATE samples SET state = 'delivered', worker = NULL, version = ?, "
            "reward = ?, failed = ?, delivery = ?, rev = ? WHERE id = ?",
            (
                delivery.version,
                reward,
                int(delivery.failed),
                delivery.model_dump_json(),
                self._next_rev(),
                delivery.id,
            ),
        )
        return "accepted"

    def arrivals(self) -> dict[str, int]:
        """How many deliveries arrived, by outcome."""
        rows = self.db.execute("SELECT outcome, COUNT(*) FROM arrivals GROUP BY outcome")
        return {str(o): int(n) for o, n in rows}

    def accepted_twice(self) -> int:
        """Samples with more than one accepted delivery: always 0 unless the ledger is
        wrong, which is why runs report it."""
        row = self.db.execute(
            "SELECT COUNT(*) FROM (SELECT id FROM arrivals WHERE outcome = 'accepted' "
            "GROUP BY id HAVING COUNT(*) > 1)"
        ).fetchone()
        return int(row[0])

    def accepted_arrivals(self) -> list[tuple[float, int, float | None]]:
        """(finished_at, tokens, latency_s) of every accepted delivery, in arrival order."""
        rows = self.db.execute(
            "SELECT finished_at, tokens, latency_s FROM arrivals WHERE outcome = 'accepted' "
            "ORDER BY seq"
        )
        return [(float(f), int(t), None if lat is None else float(lat)) for f, t, lat in rows]

    def ended_after(self, seq: int, limit: int) -> list[tuple[int, int, int, float | None, str]]:
        """(seq, batch, group, latency_s, delivery JSON) of the accepted deliveries after
        `seq`, in arrival order, at most `limit`."""
        rows = self.db.execute(
            "SELECT a.seq, s.batch, s.grp, a.latency_s, s.delivery FROM arrivals a "
            "JOIN samples s ON s.id = a.id "
            "WHERE a.outcome = 'accepted' AND a.seq > ? AND s.delivery IS NOT NULL "
            "ORDER BY a.seq LIMIT ?",
            (seq, limit),
        )
        return [(int(q), int(b), int(g), lat, str(d)) for q, b, g, lat, d in rows]

    # --- batches -------------------------------------------------------------------------

    def batch_complete(self, u: int) -> bool:
        """Every sample of batch `u` admitted and delivered."""
        if self.cursor < (u + 1) * self.batch_groups:
            return False
        row = self.db.execute(
            "SELECT COUNT(*) FROM samples WHERE batch = ? AND state != 'delivered'", (u,)
        ).fetchone()
        return int(row[0]) == 0

    def take_oldest_complete(self, u: int) -> bool:
        """AReaL-like batching: batch `u` becomes the B unconsumed groups that completed
        first (their last sample accepted earliest), whatever batch they were admitted
        into; the groups they replace take the batch numbers they leave, so every batch
        keeps B groups and is consumed once. Whether batch `u` is complete now."""
        if self.batch_complete(u):
            return True
        with self._tx():
            rows = self.db.execute(
                "SELECT s.grp, MIN(s.batch) FROM samples s LEFT JOIN arrivals a "
                "ON a.id = s.id AND a.outcome = 'accepted' WHERE s.batch >= ? GROUP BY s.grp "
                "HAVING SUM(s.state != 'delivered') = 0 "
                "ORDER BY COALESCE(MAX(a.seq), 0), s.grp",
                (u,),
            ).fetchall()
            if len(rows) < self.batch_groups:
                return False
            chosen = {int(g): int(b) for g, b in rows[: self.batch_groups]}
            current = [
                int(g)
                for (g,) in self.db.execute(
                    "SELECT DISTINCT grp FROM samples WHERE batch = ? ORDER BY grp", (u,)
                )
            ]
            leaving = [g for g in current if g not in chosen]
            coming = [g for g in chosen if chosen[g] != u]
            for old, new in zip(leaving, coming, strict=True):
                self.db.execute("UPDATE samples SET batch = ? WHERE grp = ?", (chosen[new], old))
                self.db.execute("UPDATE samples SET batch = ? WHERE grp = ?", (u, new))
        return self.batch_complete(u)

    def deliveries(self, u: int) -> list[tuple[Sample, Delivery]]:
        """Batch `u`'s samples with their deliveries, in group then sample order."""
        rows = self.db.execute(
            "SELECT id, grp, batch, attempt, state, worker, version, reward, failed, delivery "
            "FROM samples WHERE batch = ? ORDER BY grp, id",
            (u,),
        ).fetchall()
        out = []
        for r in rows:
            if r[9] is None:
                raise LedgerError(f"sample {r[0]} of batch {u} has not been delivered")
            sample, delivery = _sample(r[:9]), Delivery.model_validate_json(r[9])
            if sample.failed and not delivery.failed:  # marked failed after it arrived
                delivery = delivery.model_copy(update={"failed": True})
            out.append((sample, delivery))
        return out

    def consume(self, u: int, published: int, stats: str = "{}") -> None:
        """Batch `u` trained into version `published` (= u + 1): both recorded at once,
        with the update's statistics (JSON)."""
        with self._tx():
            if u != self._int("consumed"):
                raise LedgerError(f"batch {u} is not next: {self._int('consumed')} is")
            if published != u + 1:
                raise LedgerError(f"update {u} publishes version {u + 1}, not {published}")
            if not self.batch_complete(u):
                raise LedgerError(f"batch {u} is not complete")
            self.db.execute("UPDATE samples SET state = 'consumed' WHERE batch = ?", (u,))
            self.db.execute(
                "INSERT INTO updates (version, stats) VALUES (?, ?)", (published, stats)
            )
            self._set("consumed", str(u + 1))
            self._set("version", str(published))

    def updates(self) -> list[tuple[int, str]]:
        """(published version, statistics JSON) of every update, oldest first."""
        rows = self.db.execute("SELECT version, stats FROM updates ORDER BY version")
        return [(int(v), str(stats)) for v, stats in rows]

    def reward_by_version(self) -> dict[int, float]:
        """Mean reward of the delivered samples generated under each version (failed
        samples left out)."""
        rows = self.db.execute(
            "SELECT version, AVG(reward) FROM samples WHERE state IN ('delivered', 'consumed') "
            "AND failed = 0 GROUP BY version ORDER BY version"
        )
        return {int(v): float(r) for v, r in rows}

    def lag_counts(self) -> dict[int, int]:
        """Consumed samples by staleness: batch minus the version that generated them.
        With bound eta every key lies in [0, eta] (docs/architecture.md)."""
        rows = self.db.execute(
            "SELECT batch - version, COUNT(*) FROM samples WHERE state = 'consumed' "
            "GROUP BY batch - version ORDER BY 1"
        )
        return {int(lag): int(n) for lag, n in rows}

    def versions_in_use(self) -> set[int]:
        """Versions some unfinished (started, not consumed) sample is bound to."""
        rows = self.db.execute(
            "SELECT DISTINCT version FROM samples WHERE version IS NOT NULL "
            "AND state IN ('placed', 'parked', 'environment')"
        )
        return {int(r[0]) for r in rows}

    def counts(self) -> dict[str, int]:
        rows = self.db.execute("SELECT state, COUNT(*) FROM samples GROUP BY state")
        counts = {str(state): int(n) for state, n in rows}
        failed = self.db.execute("SELECT COUNT(*) FROM samples WHERE failed = 1").fetchone()
        counts["failed"] = int(failed[0])
        return counts


def _sample(row: Sequence[object]) -> Sample:
    sid, grp, batch, attempt, state, worker, version, reward, failed = row
    return Sample(
        id=str(sid),
        group=int(str(grp)),
        batch=int(str(batch)),
        attempt=int(str(attempt)),
        state=state,  # type: ignore[arg-type]
        worker=None if worker is None else str(worker),
        version=None if version is None else int(str(version)),
        reward=None if reward is None else float(str(reward)),
        failed=bool(failed),
    )
