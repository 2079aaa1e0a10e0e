"""Each group's KV capacity for a run's model, and the rule that needs it across the two
resources: a trajectory as long as any group's `max_model_len` must fit every group
under `h_min + delta` (otherwise a trajectory of a version only such workers serve is
stranded for ever: it can move nowhere).

CEL cannot check this: it spans the pool and the run and needs the catalog's figures.
`check_pair` applies it, so `cadence run` refuses such a pair with exit 2 and
the operator marks the run Degraded with the same sentence. The pending-demand metric
uses the capacities too, for groups that have no worker to ask.
"""

from __future__ import annotations

from cadence.common.catalog import MODELS
from cadence.common.physics import TP_DEGREES, kv_capacity_tokens
from cadence.operator.api.resources import PoolGroup, ResourceError, RolloutPool, TrainingRun
from cadence.operator.api.settings import knobs_of, longest_trajectory
from cadence.scheduler.errors import StrandingError
from cadence.scheduler.validation import check_no_stranding, required_capacity
from cadence.sim.scenario import Group


def sim_group(group: PoolGroup, devices: int = 1, plan: tuple[int, int] | None = None) -> Group:
    """A pool's group as the simulator's catalog knows it (its own figures if custom);
    with `plan` (`group_plans`' tensor-parallel degree and KV tokens), its workers pinned
    to what the operator and `cadence run` start them with."""
    return Group(
        name=group.name,
        accelerator=group.accelerator,
        devices=devices,
        affinity=group.affinity,
        price_per_hour=group.price_per_hour,
        custom=group.custom,
        tensor_parallel=None if plan is None else plan[0],
        kv_tokens=None if plan is None else plan[1],
    )


def group_plans(pool: RolloutPool, run: TrainingRun) -> dict[str, tuple[int, int]]:
    """(tensor-parallel degree, KV tokens) of one worker of each group: at the group's
    degree, or (unset) at the smallest degree that holds the longest trajectory with the
    floor and reserve to spare; the largest degree if none does. A degree never exceeds
    the devices a group's pods request. The operator starts each worker at this degree,
    so what it plans with is what runs."""
    model = MODELS[run.spec.model.catalog]
    need = required_capacity(longest_trajectory(pool), knobs_of(run))
    out = {}
    for g in pool.spec.groups:
        acc, util = sim_group(g).resolve(), g.engine.memory_utilization
        fit = [d for d in TP_DEGREES if g.devices is None or d <= g.devices] or [1]
        degrees = (g.engine.tensor_parallel,) if g.engine.tensor_parallel else fit
        for tp in degrees:
            out[g.name] = (tp, kv_capacity_tokens(model, acc, tp, util))
            if out[g.name][1] >= need:
                break
    return out


def group_capacities(pool: RolloutPool, run: TrainingRun) -> dict[str, int]:
    """KV tokens one worker of each group holds (`group_plans`)."""
    return {name: tokens for name, (_, tokens) in group_plans(pool, run).items()}


def hourly_price(group: PoolGroup) -> float:
    """What one worker of `group` costs an hour: its own price, else the catalog's list
    price for its accelerator, else 0 (unknown)."""
    if group.price_per_hour is not None:
        return group.price_per_hour
    known = sim_group(group).resolve().price_per_hour
    return known.value if known is not None else 0.0


def check_capacity(pool: RolloutPool, run: TrainingRun) -> None:
    """Raise StrandingError naming each group too small for the longest trajectory."""
    try:
        check_no_stranding(group_capacities(pool, run), longest_trajectory(pool), knobs_of(run))
    except StrandingError as e:
        raise StrandingError(f"{run.spec.model.catalog} on this pool: {e}") from None


def check_budget(pool: RolloutPool) -> None:
    """An autoscaler whose budget is below what the pool costs as it starts could only
    shrink it: a mistake in the budget, refused before anything starts."""
    scaling = pool.spec.autoscaling
    if not scaling.enabled or scaling.budget_per_hour is None:
        return
    cost = sum(g.replicas * hourly_price(g) for g in pool.spec.groups)
    if cost > scaling.budget_per_hour * (1 + 1e-9):  # sums of prices round
        raise ResourceError(
            f"RolloutPool spec.autoscaling.budgetPerHour: {scaling.budget_per_hour:g} is below "
            f"the pool's starting cost of {cost:.4g} an hour (its groups' replicas at their "
            "prices)"
        )


def check_pair(pool: RolloutPool, run: TrainingRun) -> None:
    """Rules across the two resources."""
    if run.spec.pool != pool.metadata.name:
        raise ResourceError(
            f"TrainingRun spec.pool: it names pool {run.spec.pool!r}, "
            f"but the pool here is {pool.metadata.name!r}"
        )
    try:
        check_capacity(pool, run)
    except StrandingError as e:
        raise ResourceError(f"TrainingRun {_blamed(pool, run)}: {e}") from None


def _blamed(pool: RolloutPool, run: TrainingRun) -> str:
    """The field a capacity refusal names: a pinned floor or reserve when leaving it auto
    would fit, else the model."""
    s = run.spec.scheduler
    pinned = [name for name, v in (("hMin", s.h_min), ("delta", s.delta)) if v != "auto"]
    if not pinned:
        return "spec.model"
    auto = s.model_copy(update={"h_min": "auto", "delta": "auto"})
    relaxed = run.model_copy(update={"spec": run.spec.model_copy(update={"scheduler": auto})})
    try:
        check_capacity(pool, relaxed)
    except StrandingError:
        return "spec.model"
    return " and ".join(f"spec.scheduler.{name}" for name in pinned)
