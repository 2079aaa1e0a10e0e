"""The engine inside each simulated worker, modelled on vLLM's own scheduler.

Every policy's workers run this same engine, so a comparison measures the policies, not
their engines. It keeps what vLLM does that changes the outcome: a maximum batch, new
arrivals prefilled before they decode (a prefill occupies the worker's steps), and,
when the KV cache runs out mid-decode, preemption of the newest running request by
recompute (its KV is dropped and it is prefilled again when room returns).

Macro-stepping: the engine never walks token by token. With n requests running and C
tokens of KV, step j takes overhead + max(compute, (weights + kv_bytes x (C + n j)) / bw),
an arithmetic series, so the time of k steps has a closed form, and the engine jumps
straight to the next event: a request stopping (done, or a tool call), the KV filling
up, or the time it was asked to run until.
"""

from __future__ import annotations

import heapq
import math
from _operator import add  # the C module behind `operator` (see scheduler/snapshot.py)
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat

from cadence.common.physics import Deployment
from cadence.scheduler import Resident
from cadence.scheduler.snapshot import Presorted


@dataclass(slots=True)
class Request:
    """A trajectory as an engine sees it.

    `context` is its KV in tokens when running (prompt + generated + observations);
    `to_go` is how many tokens it decodes before it next stops (its end or a tool call).
    """

    id: str
    context: int
    to_go: int
    ready_at: float = 0.0  # a KV transfer in flight: not admissible before this time
    load_s: float = 0.0  # worker time to admit it: a prefill, or 0 after a transfer
    placed_context: int = 0  # its context when placed here (set by `add`)


@dataclass(slots=True)
class _Running:
    request: Request
    anchor_step: int  # engine step at which `anchor_context` was true
    anchor_context: int
    admitted_order: int


# A Resident from an (id, context, decoded) tuple, built in C.
_resident = partial(tuple.__new__, Resident)


@dataclass(frozen=True, slots=True)
class Stop:
    """A request that stopped decoding at `time`: finished its run of `to_go` tokens."""

    request: Request
    time: float


def _steps_time(  # noqa: PLR0917 (the step model's terms; called ~10^6 times a run)
    k: int, overhead: float, base: float, grow: float, compute: float, limit: int | None
) -> float:
    """The time of k decode steps with a fixed batch: each costs `overhead` plus the
    larger of the compute floor and the memory term, which starts at `base` and grows by
    `grow` a step; the first `limit` steps are compute-bound (None: all of them). The
    terms come from `ModelledEngine._step_model`."""
    bound = k if limit is None or k < limit else limit
    memory_steps = k - bound
    first = base + grow * bound
    memory = memory_steps * first + grow * memory_steps * (memory_steps - 1) / 2.0
    return k * overhead + bound * compute + memory


def _steps_guess(  # noqa: PLR0917 (as _steps_time)
    seconds: float, overhead: float, base: float, grow: float, compute: float, limit: int | None
) -> int:
    """About the smallest k whose time reaches `seconds` (`_steps_time` decides)."""
    per_bound_step = overhead + compute
    k = math.ceil(seconds / per_bound_step) if per_bound_step > 0 else 1
    if limit is None or k <= limit:
        return k
    # Past the limit: solve grow/2 m^2 + (overhead + first - grow/2) m + c = 0.
    bound = limit
    first = base + grow * bound
    linear = overhead + first - grow / 2.0
    constant = bound * per_bound_step - seconds
    if grow <= 0.0:
        return bound + math.ceil(-constant / linear) if linear > 0 else bound + 1
    a = grow / 2.0
    m = (-linear + math.sqrt(max(0.0, linear * linear - 4.0 * a * constant))) / (2.0 * a)
    return bound + math.ceil(m)


@dataclass
class ModelledEngine:
    deployment: Deployment
    max_batch: int = 256
    time: float = 0.0
    steps: int = 0
    decoded_tokens: int = 0
    preemptions: int = 0
    prefill_seconds: float = 0.0
    _running: dict[str, _Running] = field(default_factory=dict)
    # The running requests longest first (ties by id) as parallel arrays: their ids,
    # (context - steps) and (decoded since placement - steps). Every running request
    # grows one token a step, so the order and offsets hold until one is admitted or
    # leaves, and a view of every resident is C-level maps, not a Python loop.
    _order: list[tuple[int, str]] = field(default_factory=list)  # (-offset, id), ascending
    _ids: list[str] = field(default_factory=list)
    _offsets: list[int] = field(default_factory=list)
    _decoded_offsets: list[int] = field(default_factory=list)
    _stops: list[tuple[int, int, str]] = field(default_factory=list)
    _waiting: deque[Request] = field(default_factory=deque)
    _anchor_sum: int = 0  # sum over running of (anchor_context - anchor_step)
    _admitted: int = 0
    _waiting_kv: int = 0  # sum of the contexts in _waiting
    # (id, time) of each request as it entered the batch, its prefill starting; the
    # simulator drains it to date a trajectory's first inference step.
    started: list[tuple[str, float]] = field(default_factory=list)
    # Bumped by everything that changes what `resident_views` returns, so an observer
    # can keep the last view of a worker that neither decoded nor changed hands.
    changes: int = 0
    # The deployment's figures every step's time reads, looked up once.
    _bandwidth: float = field(init=False, repr=False)
    _kv_bytes: float = field(init=False, repr=False)
    _weight_bytes: float = field(init=False, repr=False)
    _two_params: float = field(init=False, repr=False)
    _flops: float = field(init=False, repr=False)
    _overhead: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        d = self.deployment
        eff = d.efficiency
        self._bandwidth = d.tp * d.accelerator.bandwidth.value * eff.bandwidth
        self._kv_bytes = d.model.kv_bytes_per_token
        self._weight_bytes = d.model.weight_bytes
        self._two_params = 2.0 * d.model.active_params
        self._flops = d.tp * d.accelerator.flops.value * eff.decode_mfu
        self._overhead = eff.step_overhead_s

    # --- what the control plane observes -------------------------------------------

    @property
    def capacity(self) -> int:
        return self.deployment.kv_capacity_tokens

    def running_kv(self) -> int:
        return self._anchor_sum + len(self._running) * self.steps

    def context_of(self, rid: str) -> int:
        r = self._running.get(rid)
        if r is not None:
            return r.anchor_context + self.steps - r.anchor_step
        for w in self._waiting:
            if w.id == rid:
                return w.context
        raise KeyError(rid)

    def residents(self) -> list[tuple[str, int]]:
        """(id, context) of everything assigned here, running or waiting to run."""
        out = [
            (rid, r.anchor_context + self.steps - r.anchor_step) for rid, r in self._running.items()
        ]
        out += [(w.id, w.context) for w in self._waiting]
        return out

    def resident_views(self) -> list[Resident]:
        """What the control plane sees of everything assigned here: each request's
        context and the tokens it decoded since it was placed."""
        ids, contexts, decoded = self._running_arrays()
        out = list(map(_resident, zip(ids, contexts, decoded, strict=True)))
        out += [Resident(w.id, w.context, w.context - w.placed_context) for w in self._waiting]
        return out

    def presorted(self) -> Presorted | None:
        """`resident_views` as WorkerView's presorted arrays; None while requests wait
        in the queue (they are not in the running order)."""
        if self._waiting:
            return None
        return Presorted(
            tuple(self._ids), tuple(self._offsets), tuple(self._decoded_offsets), self.steps
        )

    def _running_arrays(self) -> tuple[list[str], Iterator[int], Iterator[int]]:
        steps = self.steps
        return (
            self._ids,
            map(add, self._offsets, repeat(steps)),
            map(add, self._decoded_offsets, repeat(steps)),
        )

    def assigned(self) -> tuple[int, int]:
        """(requests, tokens of context) of everything assigned here, running or queued."""
        return len(self._running) + len(self._waiting), self.running_kv() + self._waiting_kv

    def is_running(self, rid: str) -> bool:
        """In the decoding batch, not waiting in the engine's queue."""
        return rid in self._running

    def busy_after(self, now: float) -> bool:
        """Whether it is still loading, prefilling or awaiting a KV transfer past `now`."""
        return self.time > now or any(w.ready_at > now for w in self._waiting)

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    # --- what the control plane does -----------------------------------------------

    def add(self, request: Request) -> None:
        """A placement: the request queues, and is admitted (prefilled) when room allows."""
        if request.to_go < 1:
            raise ValueError(f"request {request.id} has nothing left to decode")
        request.placed_context = request.context
        self._waiting.append(request)
        self._waiting_kv += request.context
        self.changes += 1

    def remove(self, rid: str) -> Request:
        """An eviction: take the request out wherever it is, with its context current."""
        self.changes += 1
        r = self._running.pop(rid, None)
        if r is not None:
            i = bisect_left(self._order, (r.anchor_step - r.anchor_context, rid))
            del self._order[i], self._ids[i], self._offsets[i], self._decoded_offsets[i]
            request = self._materialise(r)
            self._anchor_sum -= r.anchor_context - r.anchor_step
            return request
        for i, w in enumerate(self._waiting):
            if w.id == rid:
                del self._waiting[i]
                self._waiting_kv -= w.context
                return w
        raise KeyError(rid)

    # --- running ---------------------------------------------------------------------

    def _materialise(self, r: _Running) -> Request:
        done = self.steps - r.anchor_step
        request = r.request
        request.context = r.anchor_context + done
        request.to_go -= done
        return request

    def _admit(self, until: float) -> None:
        """Admit waiting requests, oldest first, while the batch and the KV allow."""
        skipped: list[Request] = []
        while self._waiting and len(self._running) < self.max_batch and self.time < until:
            request = self._waiting.popleft()
            if request.ready_at > self.time:
                skipped.append(request)
                continue
            # Room for its KV and one step of growth for everyone running.
            n = len(self._running)
            if self._anchor_sum + n * self.steps + request.context + n + 1 > self.capacity:
                self._waiting.appendleft(request)
                break
            self._waiting_kv -= request.context
            self.started.append((request.id, self.time))
            self.time += request.load_s
            self.prefill_seconds += request.load_s
            request.load_s = 0.0
            entry = _Running(request, self.steps, request.context, self._admitted)
            self._admitted += 1
            self._running[request.id] = entry
            offset = request.context - self.steps
            key = (-offset, request.id)
            i = bisect_left(self._order, key)
            self._order.insert(i, key)
            self._ids.insert(i, request.id)
            self._offsets.insert(i, offset)
            self._decoded_offsets.insert(i, offset - request.placed_context)
            self.changes += 1
            self._anchor_sum += request.context - self.steps
            heapq.heappush(
                self._stops, (self.steps + request.to_go, entry.admitted_order, request.id)
            )
        for request in reversed(skipped):
            self._waiting.appendleft(request)

    def _preempt_newest(self) -> None:
        newest = max(self._running.values(), key=lambda r: r.admitted_order)
        request = self.remove(newest.request.id)
        request.load_s = self.deployment.prefill_s(request.context)  # recompute
        self._waiting.appendleft(request)
        self._waiting_kv += request.context
        self.preemptions += 1

    def _step_model(self, n: int, kv: int) -> tuple[float, float, float, float, int | None]:
        """The terms of `_steps_time` for n running and kv tokens of KV."""
        b = self._kv_bytes
        base = (self._weight_bytes + b * kv) / self._bandwidth  # memory term of step one
        grow = b * n / self._bandwidth  # added per step
        compute = self._two_params * n / self._flops
        # Steps before the memory term overtakes the compute floor are compute-bound.
        if base >= compute:
            limit: int | None = 0
        else:
            limit = math.ceil((compute - base) / grow) if grow else None
        return self._overhead, base, grow, compute, limit

    def _time_of(self, k: int, n: int, kv: int) -> float:
        """Seconds for k decode steps starting with n running and kv tokens of KV."""
        return _steps_time(k, *self._step_model(n, kv))

    def _steps_within(self, seconds: float, n: int, kv: int, cap: int) -> int:
        """The most steps (<= cap) that fit in `seconds`, at least one: the smallest k
        whose time reaches `seconds`, found by bisection from the closed form's guess."""
        return self._steps_and_time(seconds, n, kv, cap)[0]

    def _steps_and_time(self, seconds: float, n: int, kv: int, cap: int) -> tuple[int, float]:
        """`_steps_within` and the time those steps take, from one step model."""
        # Every step takes time (n >= 1 computes), so the time of k steps strictly
        # grows with k: the first k that reaches `seconds` is the answer, and the cap
        # when none below it does (the search ends there).
        model = self._step_model(n, kv)
        lo, hi = 1, cap if cap > 1 else 1
        guess = _steps_guess(seconds, *model)
        guess = hi if guess > hi else lo if guess < lo else guess
        at_guess = _steps_time(guess, *model)
        if at_guess >= seconds:
            if guess == lo or _steps_time(guess - 1, *model) < seconds:
                return guess, at_guess
            hi = guess - 1
        elif guess == hi:
            return hi, at_guess
        else:
            lo = guess + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if _steps_time(mid, *model) >= seconds:
                hi = mid
            else:
                lo = mid + 1
        return lo, _steps_time(lo, *model)

    def run_until(self, until: float) -> list[Stop]:
        """Decode until `until` (the engine's clock may pass it by under one step)."""
        stops: list[Stop] = []
        while self.time < until:
            if self._waiting:
                self._admit(until)
                if self.time >= until:
                    break
            if not self._running:
                ready = [w.ready_at for w in self._waiting if w.ready_at > self.time]
                self.time = min([until, *ready]) if ready else until
                continue
            running, heap = self._running, self._stops
            n = len(running)
            kv = self._anchor_sum + n * self.steps  # running_kv()
            while heap and heap[0][2] not in running:
                heapq.heappop(heap)
            to_stop = heap[0][0] - self.steps
            to_full = (self.deployment.kv_capacity_tokens - kv) // n
            if to_full < 1:
                self._preempt_newest()
                continue
            k, seconds = self._steps_and_time(
                until - self.time, n, kv, to_stop if to_stop < to_full else to_full
            )
            self.time += seconds
            steps = self.steps = self.steps + k
            self.changes += 1
            self.decoded_tokens += k * n
            while heap and heap[0][0] <= steps:
                rid = heapq.heappop(heap)[2]
                entry = running.get(rid)
                if entry is None or entry.anchor_step + entry.request.to_go != steps:
                    continue
                stops.append(Stop(self.remove(rid), self.time))
        return stops
