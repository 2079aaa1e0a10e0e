"""Transport security: a service given a certificate serves HTTPS only (a plain-HTTP
request gets nothing), and every client in a process trusts the CA bundle
`CADENCE_CA_FILE` names; a service refuses half-given or unusable TLS settings in one
sentence before it starts. Shown on `cadence environment`, the lightest service (the
worker's own run is in tests/worker/test_serve_tls.py)."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cadence.cli import main
from cadence.common.web import ServiceClient, ServiceError, client_verify
from cadence.operator.local.processes import CADENCE, free_port
from cadence.worker.tools import HttpEnvironment
from tests.helpers import eventually

from .tls import Certificates, make_certificates

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def environment(certificates: Certificates) -> Iterator[str]:
    """`cadence environment` serving HTTPS on 127.0.0.1; yields its https URL."""
    port = free_port()
    args = ["environment", "--port", str(port)]
    args += ["--tls-cert", str(certificates.cert), "--tls-key", str(certificates.key)]
    proc = subprocess.Popen(
        [*CADENCE, *args],
        env={**os.environ, "CADENCE_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"https://127.0.0.1:{port}"
    trusted = httpx.Client(verify=ssl.create_default_context(cafile=certificates.ca))

    def healthy() -> bool:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "it exited"
        return trusted.get(f"{url}/healthz").status_code == 200

    try:
        eventually(healthy, timeout_s=30, what="the environment answering over https")
        yield url
    finally:
        trusted.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_a_service_with_a_certificate_refuses_plain_http(environment: str) -> None:
    plain = environment.replace("https://", "http://")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{plain}/healthz", timeout=5)


def test_a_client_without_the_ca_does_not_trust_the_service(environment: str) -> None:
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{environment}/healthz", timeout=5)


def test_every_client_trusts_the_ca_that_cadence_ca_file_names(
    environment: str, certificates: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No CA passed to any constructor: the service client and the worker's environment
    client both pick the bundle up from the process's environment."""
    monkeypatch.setenv("CADENCE_CA_FILE", str(certificates.ca))

    async def go() -> tuple[str, ServiceError]:
        ask = HttpEnvironment(environment, TOKEN)
        client = ServiceClient(environment, "wrong token")
        try:
            observation = await ask("t", 0, "<tool>calc 6*7</tool>", 0)
            with pytest.raises(ServiceError) as refused:
                await client._call("POST", "/v1/tool")
        finally:
            await ask.http.aclose()
            await client.aclose()
        return observation, refused.value

    observation, refused = asyncio.run(go())
    assert observation == "<result>42</result>"
    assert (refused.status, refused.reason) == (401, "unauthorised")  # over TLS, still a token


def test_a_ca_file_that_cannot_be_read_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CADENCE_CA_FILE", str(tmp_path / "missing.crt"))
    with pytest.raises(ValueError, match=r"^CADENCE_CA_FILE=.*missing\.crt: cannot load"):
        client_verify()


@pytest.mark.parametrize(
    ("service", "tls", "message"),
    [
        ("environment", ["--tls-cert", "{cert}"], "--tls-cert and --tls-key go together"),
        ("environment", ["--tls-key", "{key}"], "--tls-cert and --tls-key go together"),
        ("environment", ["--tls-cert", "{cert}", "--tls-key", "/nonexistent"], "cannot read"),
        ("environment", ["--tls-cert", "{key}", "--tls-key", "{key}"], "does not load"),
        ("environment", [], "a bearer token is required"),
        ("trainer", ["--tls-cert", "{cert}"], "--tls-cert and --tls-key go together"),
        ("trainer", ["--tls-cert", "{ca}", "--tls-key", "{key}"], "does not load"),
    ],
)
def test_unusable_tls_settings_exit_2_in_one_sentence(
    certificates: Certificates,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    service: str,
    tls: list[str],
    message: str,
) -> None:
    if tls:
        monkeypatch.setenv("CADENCE_TOKEN", TOKEN)
    else:
        monkeypatch.delenv("CADENCE_TOKEN", raising=False)
    files = {"cert": certificates.cert, "key": certificates.key, "ca": certificates.ca}
    argv = [a.format(**files) for a in tls]
    if service == "trainer":
        argv += ["--config", str(tmp_path / "unused.json")]
    assert main([service, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: ") and err.count("\n") == 1
    assert message in err
