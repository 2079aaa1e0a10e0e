"""A hand-off interrupted between worker processes: a destination that claimed a parked
trajectory and died before acknowledging leaves it parked on the source, a later attempt
takes it over, and the dead destination's late messages are refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import eventually

from .factories import worker_processes

AUTH = {"Authorization": "Bearer s3cret"}
pytestmark = pytest.mark.slow  # two worker processes


@pytest.fixture(scope="module")
def workers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with worker_processes(
        ["a", "c"],
        lambda _: ["--model-path", str(tiny_model), "--grace-s", "1"],
        cwd=tmp_path_factory.mktemp("run"),
        env={"CADENCE_TOKEN": "s3cret"},
        within_s=120,
    ) as urls:
        yield urls


def _state(url: str) -> dict[str, object]:
    state: dict[str, object] = httpx.get(f"{url}/v1/state", headers=AUTH).json()
    return state


def _generated(url: str) -> int:
    """Tokens its residents have decoded."""
    residents: list[dict[str, int]] = httpx.get(f"{url}/v1/state", headers=AUTH).json()["residents"]
    return sum(r["generated"] for r in residents)


def test_a_dead_destinations_claim_is_superseded_by_the_next_attempt(
    workers: dict[str, str],
) -> None:
    a, c = workers["a"], workers["c"]
    fresh = {
        "id": "t",
        "attempt": 0,
        "version": 0,
        "fresh": {"prompt_token_ids": [5, 6, 7, 8], "max_tokens": 4_000},
    }
    assert httpx.post(f"{a}/v1/trajectories", json=fresh, headers=AUTH).status_code == 200
    eventually(lambda: _generated(a) > 0, timeout_s=60, what="t decoding on a")
    evicted = httpx.post(f"{a}/v1/trajectories/t/evict", headers=AUTH).json()
    # Destination "b" claims (attempt 1), then dies: it never starts or acknowledges.
    claim = {"attempt": 1, "destination": "b", "lease_s": 600}
    r = httpx.post(f"{a}/v1/parked/t/claim", json=claim, headers=AUTH)
    assert r.status_code == 200 and len(r.json()["turns"]) == 1
    parked = _state(a)["parked"]
    assert isinstance(parked, list) and parked[0]["claimed_until"] is not None

    # The control loop declares b lost and places attempt 2 on c, pointing at a.
    moved = {"id": "t", "attempt": 2, "version": 0, "source": {"worker_id": "a", "url": a}}
    r = httpx.post(f"{c}/v1/trajectories", json=moved, headers=AUTH)
    assert r.status_code == 200 and r.json()["context"] == evicted["context"]
    assert _state(a)["parked"] == []
    residents = _state(c)["residents"]
    assert isinstance(residents, list) and [x["id"] for x in residents] == ["t"]

    # b's late acknowledgement and a repeat of its claim are refused; so is attempt 1 on c.
    late = {"attempt": 1, "destination": "b"}
    assert httpx.post(f"{a}/v1/parked/t/release", json=late, headers=AUTH).status_code == 409
    assert httpx.post(f"{a}/v1/parked/t/claim", json=claim, headers=AUTH).status_code == 404
    stale = {**moved, "attempt": 1}
    r = httpx.post(f"{c}/v1/trajectories", json=stale, headers=AUTH)
    assert r.status_code == 409 and r.json()["reason"] == "stale_attempt"
