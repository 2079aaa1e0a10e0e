"""Property tests: on any snapshot, a plan keeps every rule, and planning is pure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.scheduler import (
    Admission,
    CadencePolicy,
    CadenceState,
    Evict,
    FreshSample,
    Knobs,
    PendingTrajectory,
    Place,
    Resident,
    Snapshot,
    StepCost,
    WorkerView,
)

from .invariants import check_plan


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[Snapshot, CadenceState]:
    newest = draw(st.integers(0, 3))
    eta = draw(st.integers(0, 3))
    batch = draw(st.integers(1, 3))
    total = draw(st.integers(0, 12)) * batch
    limit = min(total, (newest + eta + 1) * batch)
    admitted = draw(st.integers(0, limit))
    knobs = Knobs(
        h_min=draw(st.integers(0, 200)),
        delta=draw(st.integers(0, 50)),
        eta=eta,
        min_decode=draw(st.integers(1, 100)),
        concentrate_without_fresh=draw(st.booleans()),
        auto_h_min=draw(st.booleans()),
        auto_delta=draw(st.booleans()),
    )
    workers = []
    for i in range(draw(st.integers(1, 7))):
        capacity = draw(st.integers(300, 3000))
        residents: list[Resident] = []
        free = capacity
        for j in range(draw(st.integers(0, 6))):
            ctx = draw(st.integers(1, max(1, capacity // 3)))
            if ctx > free:
                break
            free -= ctx
            residents.append(Resident(f"w{i}r{j}", ctx, draw(st.integers(0, 200))))
        version = draw(st.one_of(st.none(), st.integers(0, newest)))
        workers.append(
            WorkerView(
                id=f"w{i}",
                accelerator="toy",
                affinity=draw(st.integers(0, 3)),
                version=version,
                capacity=capacity,
                residents=tuple(residents) if version is not None else (),
                draining=draw(st.sampled_from([False, False, False, True])),
                max_seqs=draw(st.one_of(st.none(), st.integers(1, 8))),
                cost=draw(
                    st.one_of(
                        st.none(),
                        st.builds(
                            StepCost,
                            weights_s=st.floats(1e-3, 0.1),
                            kv_token_s=st.floats(0.0, 1e-5),
                            seq_s=st.floats(0.0, 0.02),
                            prefill_token_s=st.floats(0.0, 1e-3),
                        ),
                    )
                ),
            )
        )
    pending = [
        PendingTrajectory(
            f"p{k}",
            draw(st.integers(0, newest)),
            draw(st.integers(1, 1500)),
            0.0,
            draw(st.booleans()),
        )
        for k in range(draw(st.integers(0, 10)))
    ]
    fresh = []
    if admitted:
        for k in range(draw(st.integers(0, 10))):
            fresh.append(
                FreshSample(f"f{k}", draw(st.integers(0, admitted - 1)), draw(st.integers(1, 200)))
            )
    version_ids = sorted({w.version for w in workers if w.version is not None})
    sources = (
        {
            v: draw(st.sampled_from([w.id for w in workers]))
            for v in draw(st.lists(st.sampled_from(version_ids), unique=True))
            if version_ids
        }
        if version_ids
        else {}
    )
    snap = Snapshot(
        now=1.0,
        workers=tuple(workers),
        pending=tuple(pending),
        fresh=tuple(fresh),
        newest_version=newest,
        admission=Admission(admitted, batch, total),
        knobs=knobs,
    )
    return snap, CadenceState.of(sources)


@settings(max_examples=400, deadline=None)
@given(snapshots(), st.sampled_from([CadencePolicy(fit="tight"), CadencePolicy(fit="worst")]))
def test_every_plan_keeps_the_rules(
    case: tuple[Snapshot, CadenceState], policy: CadencePolicy
) -> None:
    snap, state = case
    actions, new_state = policy.plan(snap, state)
    check_plan(snap, state, actions, new_state)


@settings(max_examples=200, deadline=None)
@given(snapshots())
def test_every_trajectory_ends_the_plan_in_exactly_one_place(
    case: tuple[Snapshot, CadenceState],
) -> None:
    snap, state = case
    actions, _ = CadencePolicy().plan(snap, state)
    where: dict[str, str] = {}
    for w in snap.workers:
        for r in w.residents:
            where[r.id] = w.id
    for p in snap.pending:
        where[p.id] = "pending"
    for f in snap.fresh:
        where[f.id] = "fresh"
    for a in actions:
        if isinstance(a, Place):
            assert where[a.trajectory] in ("pending", "fresh")
            where[a.trajectory] = a.worker
        elif isinstance(a, Evict):
            assert where[a.trajectory] == a.worker
            where[a.trajectory] = "pending"
    expected = {r.id for w in snap.workers for r in w.residents}
    expected |= {p.id for p in snap.pending} | {f.id for f in snap.fresh}
    assert set(where) == expected


@settings(max_examples=200, deadline=None)
@given(snapshots())
def test_same_snapshot_and_state_same_plan(case: tuple[Snapshot, CadenceState]) -> None:
    snap, state = case
    before = dict(state.sources)
    first = CadencePolicy().plan(snap, state)
    second = CadencePolicy().plan(snap, state)
    assert first == second
    assert dict(state.sources) == before
