"""Fresh samples kept ordered as they come and go, for `Snapshot(fresh_index=...)`.

A snapshot groups its fresh samples by batch, shortest first: built from scratch, that
is a sort of every fresh sample every period, and a pool whose admission window is open
holds tens of thousands of them. An observer that sees samples come and go (the
simulator, and the control loop through its copy of the ledger) keeps them sorted here
instead, and a batch that did not change shows the same tuple as the period before.
`frozen()` hands a snapshot the fresh pool itself without copying it: most policies
never read it whole (Cadence reads only the batches), and a copy of thousands of samples
every period is time a simulation need not spend.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import overload

from cadence.scheduler.snapshot import FRESH_ORDER, FreshSample


class FreshIndex:
    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.samples: dict[str, FreshSample] = {}  # by id, in the order they came
        self._sorted: dict[int, list[FreshSample]] = {}
        self._shown: dict[int, tuple[FreshSample, ...] | None] = {}
        self._changes = 0
        self._whole: tuple[FreshSample, ...] | None = None  # `samples` as of _changes

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
        self._changed()
        self.samples[sample.id] = sample
        batch = sample.group // self.batch_size
        insort(self._sorted.setdefault(batch, []), sample, key=FRESH_ORDER)
        self._shown[batch] = None

    def take(self, sid: str) -> FreshSample:
        self._changed()
        sample = self.samples.pop(sid)
        batch = sample.group // self.batch_size
        samples = self._sorted[batch]
        del samples[bisect_left(samples, FRESH_ORDER(sample), key=FRESH_ORDER)]
        if samples:
            self._shown[batch] = None
        else:
            del self._sorted[batch], self._shown[batch]
        return sample

    def _changed(self) -> None:
        self._changes += 1
        self._whole = None

    def frozen(self) -> Sequence[FreshSample]:
        """The fresh samples as of now, in the order they came, for `Snapshot(fresh=)`:
        copied only if read, and readable only until the index next changes (a plan
        reads its snapshot before its actions are applied)."""
        return _Frozen(self, self._changes, len(self.samples))

    def _whole_at(self, changes: int) -> tuple[FreshSample, ...]:
        if changes != self._changes:
            raise RuntimeError("fresh samples read from a snapshot after the pool changed")
        if self._whole is None:
            self._whole = tuple(self.samples.values())
        return self._whole

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


class _Frozen(Sequence[FreshSample]):
    __slots__ = ("_changes", "_index", "_len")

    def __init__(self, index: FreshIndex, changes: int, length: int) -> None:
        self._index, self._changes, self._len = index, changes, length

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[FreshSample]:
        return iter(self._index._whole_at(self._changes))

    @overload
    def __getitem__(self, i: int) -> FreshSample: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[FreshSample, ...]: ...
    def __getitem__(self, i: int | slice) -> FreshSample | tuple[FreshSample, ...]:
        return self._index._whole_at(self._changes)[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]
