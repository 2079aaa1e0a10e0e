"""Leader election (`operator/kube/leader.py`, `serve.operate`) against the test emulator:
one candidate holds the Lease, a second takes it only once the holder's record has not
changed for a lease duration on its own clock, or at once when the holder releases it;
of two operators, only the leader reconciles, and the standby takes over when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from cadence.devcluster.emulator import KubernetesEmulator, call
from cadence.operator.kube.client import Kube
from cadence.operator.kube.handlers import Reconciler
from cadence.operator.kube.leader import LeaderElector
from cadence.operator.kube.serve import Health, operate
from tests.helpers import eventually, example, reconciles_of

from .harness import NS, OPERATOR_S, RBAC, TIMER_S, _granted, emulator

pytestmark = pytest.mark.timeout(120)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_passes_only_when_its_holder_goes_quiet_or_lets_go() -> None:
    with emulator() as url:

        async def go() -> None:
            kube = Kube(url)
            a_clock, b_clock = FakeClock(), FakeClock()
            a = LeaderElector(kube, "default", "a", duration_s=15, clock=a_clock)
            b = LeaderElector(kube, "default", "b", duration_s=15, clock=b_clock)
            try:
                assert await a.try_acquire_or_renew()
                assert not await b.try_acquire_or_renew()
                b_clock.now = 10.0
                assert await a.try_acquire_or_renew()  # a renews: b sees a new record
                b_clock.now = 20.0
                assert not await b.try_acquire_or_renew()  # 10 s since it changed
                b_clock.now = 36.0
                assert await b.try_acquire_or_renew()  # quiet for more than 15 s: b's
                assert not await a.try_acquire_or_renew()  # a sees b hold it
                await b.release()
                assert await a.try_acquire_or_renew()  # released: no wait
                lease = await kube.get(a.url)
                assert lease is not None
                assert lease["spec"]["holderIdentity"] == "a"
                assert lease["spec"]["leaseTransitions"] == 2
            finally:
                await kube.aclose()

        asyncio.run(go())


class ElectedOperator:
    """An operator with leader election, in a thread of its own, from `start` to `stop`.
    On real time, unlike the operator's other tests (`fake_cluster.py`): two kopf
    operators cannot share one event loop, since one stopping cancels every task made
    after it started, the other's included."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.flag = threading.Event()
        self.errors: list[BaseException] = []
        self.made: list[tuple[Reconciler, LeaderElector]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            kube = Kube(self.url)
            reconciler = Reconciler(kube)
            elector = LeaderElector(kube, "default", self.name, duration_s=30, retry_s=0.2)
            self.made.append((reconciler, elector))
            try:
                await operate(
                    kube,
                    server=self.url,
                    namespaces=["default"],
                    reconciler=reconciler,
                    resync_s=TIMER_S,
                    elector=elector,
                    stop_flag=self.flag,
                )
            finally:
                await kube.aclose()

        try:
            asyncio.run(main())
        except BaseException as e:
            self.errors.append(e)

    def start(self) -> tuple[Reconciler, LeaderElector]:
        self.thread.start()
        made: tuple[Reconciler, LeaderElector] = eventually(
            lambda: self.made[0] if self.made else None, timeout_s=OPERATOR_S, what=self.name
        )
        return made

    def stop(self) -> None:
        self.flag.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive() and self.errors == []


def test_only_the_leader_reconciles_and_the_standby_takes_over_when_it_stops() -> None:
    kube = KubernetesEmulator()
    with emulator(kube) as url:
        call(url, "POST", f"{NS}/rolloutpools", example("RolloutPool"))
        first, second = ElectedOperator(url, "first"), ElectedOperator(url, "second")
        try:
            leader, leader_lease = first.start()
            eventually(lambda: leader_lease.leading, timeout_s=OPERATOR_S, what="first leads")
            eventually(
                lambda: reconciles_of(leader.metrics, "rolloutpools", "mixed") >= 1,
                timeout_s=OPERATOR_S,
                what="the leader reconciling the pool",
            )
            standby, standby_lease = second.start()
            eventually(
                lambda: (standby_lease.observed or (None,))[0] == "first",
                timeout_s=OPERATOR_S,
                what="the standby seeing the leader hold the Lease",
            )
            assert not standby_lease.leading
            assert reconciles_of(standby.metrics, "rolloutpools", "mixed") == 0
            first.stop()  # it releases the Lease: no lease duration (30 s) to wait out
            eventually(
                lambda: standby_lease.leading, timeout_s=OPERATOR_S, what="the standby leads"
            )
            other = example("RolloutPool")
            other["metadata"]["name"] = "other"
            call(url, "POST", f"{NS}/rolloutpools", other)
            eventually(
                lambda: any(
                    g["spec"]["pool"] == "other"
                    for g in call(url, "GET", f"{NS}/rolloutgroups")["items"]
                ),
                timeout_s=OPERATOR_S,
                what="the new leader making the new pool's groups",
            )
        finally:
            for op in (first, second):
                if op.thread.is_alive():
                    op.stop()
    # What the candidates did to their Lease, the shipped Role allows.
    granted = _granted(RBAC, "Role", "cadence-operator-leader")
    done = {(v, g, r) for _, v, g, r in kube.audit if r == "leases"}
    assert done and done <= granted


def test_a_standby_is_healthy_and_a_leader_whose_operator_stopped_is_not() -> None:
    """A standby answers its liveness probe (else the kubelet would restart it for ever);
    a leader answers while its kopf operator runs."""

    async def go() -> list[tuple[int, str | None]]:
        health = Health()
        said = [await health.healthz(None)]  # type: ignore[arg-type]

        async def forever() -> None:
            await asyncio.Event().wait()

        running = asyncio.ensure_future(forever())
        health.operator = running
        said.append(await health.healthz(None))  # type: ignore[arg-type]
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        said.append(await health.healthz(None))  # type: ignore[arg-type]
        return [(r.status, r.text) for r in said]

    assert asyncio.run(go()) == [
        (200, "standby\n"),
        (200, "leading\n"),
        (503, "the operator stopped\n"),
    ]
