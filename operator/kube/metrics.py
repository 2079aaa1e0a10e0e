"""The operator's Prometheus metrics, read at scrape time.

Per RolloutGroup: the demand waiting for a worker of its type (the gauge
`manifests/autoscaling/hpa.yaml` scales a group on, through prometheus-adapter), its
workers, and their mean headroom. Per TrainingRun: its control loop's counters (cycles,
actions, errors, re-queued samples, lost workers, the last cycle's duration) and the
run's version and throughput. A run's series go when its control loop ends. Per object:
how many times its reconciler has run to the end (an invalid object's too), which says
whether the operator is keeping up and when it last looked.

One collector for the whole operator: kopf runs a loop per TrainingRun in one process,
and each registers here under its namespace and name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cadence.operator.control.group_stats import GroupStats
from cadence.operator.control.loop import ControlLoop

RunKey = tuple[str, str]  # (namespace, TrainingRun name)


@dataclass
class RunSeries:
    pool: str
    loop: ControlLoop
    groups: dict[str, GroupStats] = field(default_factory=dict)  # RolloutGroup name -> stats
    version: int = 0
    tokens_per_second: float = 0.0
    desired: dict[str, int] = field(default_factory=dict)  # the autoscaler's targets


@dataclass(eq=False)  # registries key collectors by identity
class OperatorMetrics(Collector):
    runs: dict[RunKey, RunSeries] = field(default_factory=dict)
    # Reconciles run to the end, per (plural, namespace, name).
    reconciles: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def collect(self) -> Iterable[Metric]:
        reconciled = CounterMetricFamily(
            "cadence_operator_reconciles",
            "Reconciles of an object run to the end (an invalid object's included).",
            labels=["kind", "namespace", "name"],
        )
        for (kind, namespace, name), n in sorted(self.reconciles.items()):
            reconciled.add_metric([kind, namespace, name], n)
        yield reconciled
        group_labels = ["namespace", "pool", "rolloutgroup"]
        gauges = {
            "pending_trajectories": "Trajectories waiting for a worker of this group's type.",
            "pending_tokens": "KV tokens of the trajectories waiting for this group.",
            "workers": "Workers of this group the control loop observes.",
            "headroom_tokens": "Mean free KV tokens per worker of this group.",
        }
        for name, doc in gauges.items():
            family = GaugeMetricFamily(f"cadence_group_{name}", doc, labels=group_labels)
            for (ns, _), run in sorted(self.runs.items()):
                for group, stats in sorted(run.groups.items()):
                    family.add_metric([ns, run.pool, group], getattr(stats, name))
            yield family
        desired = GaugeMetricFamily(
            "cadence_group_desired_replicas",
            "The replicas the pool's autoscaler wants for this group (spec.autoscaling); an "
            "HPA or KEDA may scale the group on it.",
            labels=group_labels,
        )
        for (ns, _), run in sorted(self.runs.items()):
            for group, n in sorted(run.desired.items()):
                desired.add_metric([ns, run.pool, group], n)
        yield desired
        run_labels = ["namespace", "trainingrun"]
        version = GaugeMetricFamily(
            "cadence_run_policy_version", "The newest policy version.", labels=run_labels
        )
        throughput = GaugeMetricFamily(
            "cadence_run_tokens_per_second", "Tokens delivered per second.", labels=run_labels
        )
        for key, run in sorted(self.runs.items()):
            version.add_metric(list(key), run.version)
            throughput.add_metric(list(key), run.tokens_per_second)
        yield version
        yield throughput
        # Each run's loop metrics, labelled with the run.
        merged: dict[str, Metric] = {}
        for (ns, name), run in sorted(self.runs.items()):
            for loop_family in run.loop.collector().collect():
                out = merged.setdefault(
                    loop_family.name,
                    Metric(loop_family.name, loop_family.documentation, loop_family.type),
                )
                for sample in loop_family.samples:
                    labels = {"namespace": ns, "trainingrun": name, **sample.labels}
                    out.add_sample(sample.name, labels, sample.value)
        yield from merged.values()
