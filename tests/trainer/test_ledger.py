"""The ledger: every admitted sample ends exactly once, only its current attempt's
delivery counts, and a batch is consumed once, with the version it published."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.trainer.api import sample_id
from cadence.trainer.ledger import Ledger, LedgerError

from .factories import delivery


def _ledger(path: Path, groups: int = 2) -> Ledger:
    ledger = Ledger(path / "ledger.db", group_size=2, batch_groups=1)
    for g in range(groups):
        ledger.admit([10 + g, 11], answer=str(g))
    return ledger


def test_admission_numbers_groups_and_batches(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, groups=3)
    assert ledger.cursor == 3
    assert [(s.id, s.batch, s.state) for s in ledger.samples()][:3] == [
        ("g0-s0", 0, "fresh"),
        ("g0-s1", 0, "fresh"),
        ("g1-s0", 1, "fresh"),
    ]
    assert ledger.group(1).prompt == [11, 11] and ledger.group(1).answer == "1"


def test_only_the_current_attempt_is_delivered_and_only_once(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    sid = sample_id(0, 0)
    assert ledger.record(sid, 0, "placed", worker="a", version=0)
    assert ledger.requeue(sid) == 1  # worker a was lost
    assert not ledger.record(sid, 0, "parked", worker="a")  # a's late news is ignored
    assert ledger.deliver(delivery(sid, attempt=0), reward=1.0) == "stale"
    assert ledger.deliver(delivery(sid, attempt=1), reward=1.0) == "accepted"
    assert ledger.deliver(delivery(sid, attempt=1), reward=1.0) == "duplicate"
    assert ledger.deliver(delivery("nope"), reward=1.0) == "unknown"
    s = ledger.sample(sid)
    assert (s.state, s.attempt, s.reward, s.worker) == ("delivered", 1, 1.0, None)
    with pytest.raises(LedgerError, match="not re-queued"):
        ledger.requeue(sid)


def test_a_batch_is_consumed_once_with_its_version_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    ledger = _ledger(tmp_path)
    ledger.deliver(delivery("g0-s0"), reward=0.5)
    assert not ledger.batch_complete(0)
    with pytest.raises(LedgerError, match="not complete"):
        ledger.consume(0, published=1)
    ledger.deliver(delivery("g0-s1", failed=True), reward=0.0)
    assert ledger.batch_complete(0) and not ledger.batch_complete(1)
    assert [s.id for s, _ in ledger.deliveries(0)] == ["g0-s0", "g0-s1"]
    ledger.consume(0, published=1)
    with pytest.raises(LedgerError, match="not next"):
        ledger.consume(0, published=1)
    ledger.close()

    reopened = Ledger(tmp_path / "ledger.db", group_size=2, batch_groups=1)
    assert (reopened.version, reopened.consumed_batches, reopened.cursor) == (1, 1, 2)
    assert reopened.counts() == {"consumed": 2, "fresh": 2, "failed": 1}
    with pytest.raises(LedgerError, match="group_size 2, not 4"):
        Ledger(tmp_path / "ledger.db", group_size=4, batch_groups=1)


def test_oldest_complete_batching_trains_the_groups_that_finished_first(tmp_path: Path) -> None:
    """AReaL-like: the update takes the B groups that completed first, whatever batch
    admitted them; the groups it displaces take their places, so each batch still holds
    B groups and every sample is consumed once."""
    ledger = Ledger(tmp_path / "ledger.db", group_size=2, batch_groups=2)
    for g in range(6):
        ledger.admit([10 + g, 11], answer=str(g))
    for sid in ("g3-s0", "g3-s1", "g0-s0", "g4-s1", "g4-s0", "g0-s1"):  # g3, g4, g0 complete
        ledger.deliver(delivery(sid), reward=0.0)
    assert not ledger.batch_complete(0)
    assert ledger.take_oldest_complete(0)
    assert {s.group for s, _ in ledger.deliveries(0)} == {3, 4}
    by_group = {s.group: s.batch for s in ledger.samples()}
    assert by_group == {0: 1, 1: 2, 2: 1, 3: 0, 4: 0, 5: 2}  # g0, g1 took g3's, g4's places
    ledger.consume(0, published=1)
    assert not ledger.take_oldest_complete(1)  # only g0 is complete among the rest
    for sid in ("g5-s0", "g5-s1"):
        ledger.deliver(delivery(sid), reward=0.0)
    assert ledger.take_oldest_complete(1)
    assert {s.group for s, _ in ledger.deliveries(1)} == {0, 5}
    ledger.consume(1, published=2)
    assert ledger.counts()["consumed"] == 8 and ledger.accepted_twice() == 0


def test_changed_since_lists_exactly_what_changed_after_a_rev_and_revs_survive_a_restart(
    tmp_path: Path,
) -> None:
    ledger = _ledger(tmp_path, groups=3)
    admitted = ledger.rev
    assert [r[0] for r in ledger.changed_since(0)] == [s.id for s in ledger.samples()]
    assert ledger.changed_since(admitted) == []
    ledger.record("g0-s0", 0, "placed", worker="a", version=0)
    placed = ledger.rev
    ledger.requeue("g1-s1")
    ledger.deliver(delivery("g0-s0", attempt=0), reward=1.0)
    assert placed > admitted and ledger.rev > placed
    assert ledger.changed_since(admitted) == [
        ("g0-s0", 0, 0, "delivered", None, 0),
        ("g1-s1", 1, 1, "fresh", None, None),
    ]
    assert not ledger.record("g1-s1", 0, "placed", worker="b")  # not taken: nothing changes
    assert [r[0] for r in ledger.changed_since(placed)] == ["g0-s0", "g1-s1"]
    epoch, rev = ledger.epoch, ledger.rev
    ledger.close()
    again = Ledger(tmp_path / "ledger.db", group_size=2, batch_groups=1)
    assert (again.epoch, again.rev) == (epoch, rev)
    again.record("g2-s0", 0, "parked", worker="c")
    assert again.changed_since(rev) == [("g2-s0", 2, 0, "parked", "c", None)]
    assert Ledger(tmp_path / "other.db", group_size=2, batch_groups=1).epoch != epoch


def test_a_ledger_written_before_revs_existed_opens_and_counts_changes_from_then(
    tmp_path: Path,
) -> None:
    ledger = _ledger(tmp_path)
    ledger.db.execute("DROP INDEX samples_by_rev")
    ledger.db.execute("ALTER TABLE samples DROP COLUMN rev")
    ledger.close()
    reopened = Ledger(tmp_path / "ledger.db", group_size=2, batch_groups=1)
    assert reopened.rev == 0 and reopened.changed_since(0) == []
    reopened.requeue("g0-s1")
    assert [r[0] for r in reopened.changed_since(0)] == ["g0-s1"]
