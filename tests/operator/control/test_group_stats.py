"""What a group holds and the demand waiting for it, from one snapshot and plan: what
`kubectl get rolloutgroups` shows and what an autoscaler scales a group on."""

from __future__ import annotations

from cadence.operator.control.group_stats import group_stats
from cadence.scheduler.actions import Action, Evict, EvictReason, Place
from cadence.scheduler.autoscale import GroupShape, wanted_group
from cadence.scheduler.cadence import CadencePolicy
from tests.scheduler.factories import make_knobs, make_pending, make_snapshot, make_worker

GROUPS = [GroupShape("pool-h800", affinity=2, capacity=1_000), GroupShape("pool-a910x", 1, 600)]
GROUP_OF = {"h0": "pool-h800", "a0": "pool-a910x", "a1": "pool-a910x"}


def test_a_trajectory_waits_for_the_highest_affinity_group_that_holds_it() -> None:
    knobs = make_knobs(h_min=100, delta=10)
    assert wanted_group(300, GROUPS, knobs) == "pool-h800"
    assert wanted_group(890, GROUPS, knobs) == "pool-h800"  # 1000 - 890 >= 110
    assert wanted_group(891, GROUPS, knobs) is None  # fits nowhere: no group's demand
    low_first = [GroupShape("big", 0, 5_000), GroupShape("small", 0, 1_000)]
    assert wanted_group(300, low_first, knobs) == "big"  # equal affinity: the larger


def test_what_the_plan_leaves_waiting_is_each_groups_demand() -> None:
    snapshot = make_snapshot(
        [
            make_worker("h0", 1_000, [700], version=1, affinity=2),
            make_worker("a0", 600, [100, 200], version=1, affinity=1),
            make_worker("a1", 600, [], version=2, affinity=1),
        ],
        pending=[
            make_pending("p-placed", 50, version=1),
            make_pending("p-long", 400, version=1),
            make_pending("p-tool", 80, version=1, placeable=False),  # waits for its environment
        ],
        knobs=make_knobs(h_min=100, delta=10),
    )
    actions: list[Action] = [
        Place("p-placed", "a0", 1, 50),
        Evict("a0-r1", "a0", 200, EvictReason.SOURCE),  # departed, placed nowhere
    ]
    stats = group_stats(snapshot, actions, GROUPS, GROUP_OF)
    h800, a910x = stats["pool-h800"], stats["pool-a910x"]
    assert (h800.pending_trajectories, h800.pending_tokens) == (2, 600)
    assert (a910x.pending_trajectories, a910x.pending_tokens) == (0, 0)
    assert a910x.workers == 2 and a910x.versions == (1, 2)
    assert a910x.mean_context == 150.0  # its residents: 100 and 200
    assert a910x.headroom_tokens == (300 + 600) // 2
    assert h800.headroom_tokens == 300 and h800.mean_context == 700.0


def test_a_group_without_workers_reports_only_its_demand() -> None:
    snapshot = make_snapshot(
        [make_worker("a0", 600, [], affinity=1)],
        pending=[make_pending("p", 300)],
        knobs=make_knobs(h_min=100, delta=10),
    )
    # Cadence places p on a0 (it fits): nothing waits.
    actions, _ = CadencePolicy().plan(snapshot, CadencePolicy().initial_state())
    assert group_stats(snapshot, actions, GROUPS, GROUP_OF)["pool-h800"].pending_trajectories == 0
    stats = group_stats(snapshot, [], GROUPS, GROUP_OF)["pool-h800"]
    assert stats.workers == 0 and stats.versions == () and stats.pending_trajectories == 1
