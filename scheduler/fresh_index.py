"""Fresh samples kept ordered as they come and go, for `Snapshot(fresh_index=...)`.

A snapshot groups its fresh samples by batch, shortest first: built from scratch, that
is a sort of every fresh sample every period, and a pool whose admission window is open
holds tens of thousands of them. An observer that sees samples come and go (the
simulator, and the control loop through its copy of the ledger) keeps them sorted here
instead, and a batch that did not change shows the same tuple as the period before.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping

from cadence.scheduler.snapshot import FRESH_ORDER, FreshSample


class FreshIndex:
    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.samples: dict[str, FreshSample] = {}  # by id, in the order they came
        self._sorted: dict[int, list[FreshSample]] = {}
        self._shown: dict[int, tuple[FreshSample, ...] | None] = {}

    @classmethod
    def of(cls, batch_size: int, samples: Iterable[FreshSample]) -> FreshIndex:
        """An index of `samples`, sorted once (adding them one by one moves each
        batch's list on every insertion)."""
        index = cls(batch_size)
        index.samples = {f.id: f for f in samples}
        for f in sorted(index.samples.values(), key=FRESH_ORDER):
            index._sorted.setdefault(f.group // batch_size, []).append(f)
        index._shown = dict.fromkeys(index._sorted)
        return index

    def __len__(self) -> int:
        return len(self.samples)

    def __contains__(self, sid: object) -> bool:
        return sid in self.samples

    def add(self, sample: FreshSample) -> None:
        self.samples[sample.id] = sample
        batch = sample.group // self.batch_size
        insort(self._sorted.setdefault(batch, []), sample, key=FRESH_ORDER)
        self._shown[batch] = None

    def take(self, sid: str) -> FreshSample:
        sample = self.samples.pop(sid)
        batch = sample.group // self.batch_size
        samples = self._sorted[batch]
        del samples[bisect_left(samples, FRESH_ORDER(sample), key=FRESH_ORDER)]
        if samples:
            self._shown[batch] = None
        else:
            del self._sorted[batch], self._shown[batch]
        return sample

    def by_batch(self) -> Mapping[int, tuple[FreshSample, ...]]:
        """`Snapshot.fresh_by_batch` of these samples: each batch shortest first (ties by
        id), batches in the order of their shortest sample."""
        shown = self._shown
        for batch, samples in self._sorted.items():
            if shown[batch] is None:
                shown[batch] = tuple(samples)
        first = {b: FRESH_ORDER(ss[0]) for b, ss in self._sorted.items()}
        return {b: self._shown_of(b) for b in sorted(first, key=first.__getitem__)}

    def _shown_of(self, batch: int) -> tuple[FreshSample, ...]:
        shown = self._shown[batch]
        assert shown is not None
        return shown
