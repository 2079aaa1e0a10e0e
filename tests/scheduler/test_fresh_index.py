"""Fresh samples kept sorted as they come and go show exactly what a snapshot would
build from them from scratch: each batch shortest first, batches by their shortest."""

from __future__ import annotations

import random

import pytest

from cadence.scheduler.fresh_index import FreshIndex
from cadence.scheduler.snapshot import FRESH_ORDER, FreshSample


def _from_scratch(
    samples: list[FreshSample], batch: int
) -> list[tuple[int, tuple[FreshSample, ...]]]:
    grouped: dict[int, list[FreshSample]] = {}
    for f in sorted(samples, key=FRESH_ORDER):
        grouped.setdefault(f.group // batch, []).append(f)
    return [(b, tuple(fs)) for b, fs in grouped.items()]


def test_the_index_kept_through_adds_and_takes_equals_one_built_from_scratch() -> None:
    rng = random.Random(5)
    index, n = FreshIndex(4), 0
    held: dict[str, FreshSample] = {}
    for _ in range(600):
        if held and rng.random() < 0.45:
            sid = rng.choice(sorted(held))
            assert index.take(sid) == held.pop(sid)
        else:
            f = FreshSample(f"g{n}", rng.randint(0, 30), rng.choice([5, 9, 9, 40]))
            index.add(f)
            held[f.id] = f
            n += 1
        assert list(index.by_batch().items()) == _from_scratch(list(held.values()), 4)
        assert len(index) == len(held) and all(sid in index for sid in held)
    rebuilt = FreshIndex.of(4, held.values())
    assert list(rebuilt.by_batch().items()) == list(index.by_batch().items())


def test_a_batch_that_did_not_change_shows_the_same_tuple() -> None:
    index = FreshIndex.of(2, [FreshSample("a", 0, 5), FreshSample("b", 3, 7)])
    before = index.by_batch()
    index.add(FreshSample("c", 2, 1))
    after = index.by_batch()
    assert after[0] is before[0] and after[1] != before[1]
    assert list(after) == [1, 0]  # batch 1 now holds the shortest sample


def test_a_snapshot_reads_the_pool_as_it_was_and_never_after_it_changed() -> None:
    index = FreshIndex.of(2, [FreshSample("a", 0, 5), FreshSample("b", 1, 7)])
    frozen = index.frozen()
    assert len(frozen) == 2 and list(frozen) == [index.samples["a"], index.samples["b"]]
    assert frozen[-1].id == "b" and frozen[:1] == (index.samples["a"],)
    index.take("a")
    later = index.frozen()
    assert [f.id for f in later] == ["b"]
    with pytest.raises(RuntimeError, match="after the pool changed"):
        frozen[0]  # read after the take: refused, never a pool that no longer is
