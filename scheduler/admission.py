"""Admission under the staleness bound `eta`, and when a version has run out of short work.

Groups are numbered in admission order and batch u is groups [u*B, (u+1)*B). The k-th
group may be admitted only while k < (v + eta + 1) * B for the newest published version v,
and a sample of batch u may start only on a worker serving a version >= u - eta. Together
these keep every sample of batch u generated under a version >= u - eta (docs/architecture.md,
"Admission and staleness").
"""

from __future__ import annotations

from cadence.scheduler.snapshot import Snapshot


def admission_limit(snapshot: Snapshot) -> int:
    """Groups that may have been admitted in total now: min(total, (v + eta + 1) * B)."""
    adm = snapshot.admission
    bound = (snapshot.newest_version + snapshot.knobs.eta + 1) * adm.batch_size
    return min(adm.total_groups, bound)


def groups_to_admit(snapshot: Snapshot) -> int:
    """The admission rule: admit every group the staleness bound allows, and no more."""
    return max(0, admission_limit(snapshot) - snapshot.admission.groups_admitted)


def may_start(batch: int, version: int, eta: int) -> bool:
    """A sample of `batch` may start (bind) on a worker serving `version` iff v >= u - eta."""
    return version >= batch - eta


class ShortEnd:
    """The fresh work a version can still draw on, computed once per cycle.

    Fresh samples of batch u may start on every version >= u - eta, so the earliest batch
    among waiting and about-to-be-admitted samples decides, for every version at once,
    whether short work remains for it.
    """

    __slots__ = ("_any_fresh", "_earliest_batch", "_eta")

    def __init__(self, snapshot: Snapshot) -> None:
        adm = snapshot.admission
        self._eta = snapshot.knobs.eta
        earliest: int | None = None
        if snapshot.fresh_by_batch:
            earliest = min(snapshot.fresh_by_batch)
        if groups_to_admit(snapshot) > 0:
            next_batch = adm.groups_admitted // adm.batch_size
            earliest = next_batch if earliest is None else min(earliest, next_batch)
        self._earliest_batch = earliest
        self._any_fresh = earliest is not None

    def exhausted(self, version: int) -> bool:
        """exhausted(v): no fresh sample a worker of v may start is waiting or admissible now.

        The architecture words the second half as "the admission bound allows no further
        group now". Read literally, a group admissible now but of a batch too new for v would keep
        v un-exhausted although it can never reach v's workers; what serves the intent is
        whether any admissible group could start on v, which is what is checked here.
        """
        if self._earliest_batch is None:
            return True
        return not may_start(self._earliest_batch, version, self._eta)

    def newer_has_fresh(self, version: int, newest: int) -> bool:
        """A version newer than `version` is published and fresh work could start on it.

        Any waiting or admissible sample may start on the newest version (it was admitted
        under a bound no newer than the newest), so this is: newest > v and fresh exists.
        """
        return newest > version and self._any_fresh
