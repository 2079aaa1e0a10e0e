"""`cadence bench operator` runs the operator on the emulator, small, and reports what it
promises: the pool converged, scaled out and back, its requests by verb and resource per
phase, none of them a GET of a single worker pod (timings are not asserted: they belong
to the bench's numbers, not to a test)."""

from __future__ import annotations

import json

import pytest

from cadence.bench.operator import classify
from cadence.cli import main

pytestmark = pytest.mark.timeout(300)


def test_operator_bench_converges_and_counts_requests_per_phase(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "operator", "--pods", "16", "--groups", "2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["pods"], out["groups"]) == (16, 2)
    for phase in ("converge", "scale_out", "scale_in"):
        assert out[f"{phase}_s"] > 0 and out[f"{phase}_wall_s"] >= 0
    phases = out["phases"]
    assert set(phases) == {"startup", "converge", "settle", "steady", "scale_out", "scale_in"}
    # 16 pods made, 2 more on the scale-out (a tenth of 8, rounded up, per group), 2 gone.
    assert phases["converge"]["by_resource"]["pods"]["create"] == 16
    assert phases["scale_out"]["by_resource"]["pods"]["create"] == 2
    assert phases["scale_in"]["by_resource"]["pods"]["delete"] == 2
    assert out["get_per_pod"] == 0
    assert all(p["get_per_pod"] == 0 for p in phases.values())
    assert out["requests_total"] == sum(out["requests_by_verb"].values()) > 0
    assert set(out["requests_by_verb"]) >= {"get", "list", "watch", "create", "patch", "delete"}
    assert out["requests_per_resync"] > 0
    # A pool at rest writes no status: a resync that would change nothing skips it.
    assert out["status_patches_per_resync"] == 0
    assert set(out["status_patches"]) == set(phases)


def test_classify_reads_requests_as_rbac_names_them() -> None:
    pods = "/api/v1/namespaces/default/pods"
    assert classify("GET", pods, {}, "a").verb == "list"
    assert classify("GET", pods, {"watch": "true"}, "a").verb == "watch"
    one = classify("GET", f"{pods}/w-0", {}, "a")
    assert (one.verb, one.resource, one.name) == ("get", "pods", "w-0")
    status = classify(
        "PATCH", "/apis/cadence.dev/v1alpha1/namespaces/d/rolloutgroups/g/status", {}, "a"
    )
    assert (status.verb, status.resource, status.name) == ("patch", "rolloutgroups/status", "g")
    assert classify("GET", "/apis/cadence.dev/v1alpha1", {}, "a").verb == "discovery"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--groups", "33"], "--groups must be at most 32"),
        (["--pods", "4", "--groups", "8"], "--pods must be at least --groups"),
        (["--pods", "0"], "at least 1"),
    ],
)
def test_operator_bench_refuses_bad_sizes_in_one_sentence(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "operator", *argv]) == 2
    assert said in capsys.readouterr().err
