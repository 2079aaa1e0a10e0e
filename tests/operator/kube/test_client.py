"""The operator's Kubernetes client (`operator/kube/client.py`) and where its credentials
come from (`credentials.py`): requests the API server sheds or fails briefly are retried
with backoff, others are not; a kubeconfig's named context is the one used, with its
token; missing credentials are one sentence from the CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import yaml

from cadence.cli import main
from cadence.operator.kube.client import TRIES, Kube, KubeError
from cadence.operator.kube.credentials import connection


class Flaky:
    """An API server answering `codes` in turn (then 200), recording what was asked."""

    def __init__(self, *codes: int, retry_after: str | None = None) -> None:
        self.codes = list(codes)
        self.retry_after = retry_after
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request.method)
        code = self.codes.pop(0) if self.codes else 200
        headers = {"Retry-After": self.retry_after} if self.retry_after and code == 429 else {}
        return httpx.Response(code, json={"items": [], "code": code}, headers=headers)


def _kube(server: Flaky, slept: list[float]) -> Kube:
    async def sleep(s: float) -> None:
        slept.append(s)

    return Kube("http://api", transport=httpx.MockTransport(server), sleep=sleep)


def test_load_shed_and_brief_failures_are_retried_with_backoff() -> None:
    server, slept = Flaky(503, 429, 502, retry_after="3"), list[float]()
    kube = _kube(server, slept)
    assert asyncio.run(kube.list("/api/v1/namespaces/default/pods")) == []
    assert server.asked == ["GET"] * 4
    assert slept == [0.25, 3.0, 1.0]  # backoff doubles; a 429 says how long itself


def test_a_server_that_stays_down_is_an_error_after_the_last_try() -> None:
    server, slept = Flaky(*[503] * TRIES), list[float]()
    with pytest.raises(KubeError) as failed:
        asyncio.run(_kube(server, slept).patch("/api/v1/namespaces/default/pods/p", {}))
    assert failed.value.status == 503 and len(server.asked) == TRIES


@pytest.mark.parametrize("code", [404, 409, 422, 403])
def test_an_answer_is_not_retried(code: int) -> None:
    server, slept = Flaky(code), list[float]()
    with pytest.raises(KubeError):
        asyncio.run(
            _kube(server, slept).create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "default"},
                }
            )
        )
    assert server.asked == ["POST"] and slept == []


def _kubeconfig(path: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dev",
                "cluster": {"server": "https://dev.example:6443", "insecure-skip-tls-verify": True},
            },
            {
                "name": "prod",
                "cluster": {
                    "server": "https://prod.example:6443",
                    "insecure-skip-tls-verify": True,
                },
            },
        ],
        "users": [
            {"name": "dev-user", "user": {"token": "dev-token"}},
            {"name": "prod-user", "user": {"token": "prod-token"}},
        ],
        "contexts": [
            {"name": "dev", "context": {"cluster": "dev", "user": "dev-user"}},
            {"name": "prod", "context": {"cluster": "prod", "user": "prod-user"}},
        ],
        "current-context": "dev",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_kubeconfig_context_gives_its_server_and_token(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "config")
    current = connection(kubeconfig=config)
    named = connection(kubeconfig=config, context="prod")
    assert (current.server, current.token) == ("https://dev.example:6443", "dev-token")
    assert (named.server, named.token) == ("https://prod.example:6443", "prod-token")
    kube = Kube.connect(named)
    assert kube.http.headers["Authorization"] == "Bearer prod-token"
    assert str(kube.http.base_url).startswith("https://prod.example:6443")
    asyncio.run(kube.aclose())


def test_the_operator_without_credentials_says_so_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    code = main(["operator", "--all-namespaces", "--kubeconfig", str(missing)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("cadence: error: no Kubernetes credentials")
    assert len(err.strip().splitlines()) == 1
    code = main(
        [
            "operator",
            "--all-namespaces",
            "--kubeconfig",
            str(_kubeconfig(tmp_path / "c")),
            "--context",
            "staging",
        ]
    )
    assert code == 2 and "staging" in capsys.readouterr().err
    config = str(_kubeconfig(tmp_path / "d"))
    code = main(["operator", "--all-namespaces", "--server", "http://x", "--kubeconfig", config])
    err = capsys.readouterr().err
    assert (
        code == 2
        and err.strip() == "cadence: error: give --server or --kubeconfig/--context, not both"
    )


def test_a_refusal_reads_as_the_api_servers_sentence_not_its_status_object() -> None:
    said = 'RolloutGroup.cadence.dev "fleet-h800" is invalid: spec.replicas: Invalid value: 9'

    def refuses(request: httpx.Request) -> httpx.Response:
        body = {"kind": "Status", "status": "Failure", "message": said, "code": 422}
        return httpx.Response(422, json=body)

    kube = Kube("http://api", transport=httpx.MockTransport(refuses))
    with pytest.raises(KubeError) as refused:
        asyncio.run(kube.patch("/apis/cadence.dev/v1alpha1/x", {}))
    assert str(refused.value) == f"422: {said}"
