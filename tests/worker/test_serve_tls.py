"""`cadence worker --tls-cert --tls-key`: the worker serves HTTPS only. A plain-HTTP
request gets no answer, and the worker's clients (the operator's, its peers') reach it
with the CA that `CADENCE_CA_FILE` names and the pool's token."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from cadence.worker.client import WorkerClient
from tests.common.tls import make_certificates
from tests.helpers import eventually

from .factories import CADENCE, free_port


@pytest.mark.slow
def test_a_worker_with_a_certificate_answers_https_only(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = make_certificates(tmp_path)
    port = free_port()
    args = ["worker", "--id", "w0", "--model-path", str(tiny_model), "--port", str(port)]
    args += ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
    proc = subprocess.Popen(
        [*CADENCE, *args],
        env={**os.environ, "CADENCE_TOKEN": "s3cret"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    url = f"https://127.0.0.1:{port}"
    trusted = httpx.Client(verify=ssl.create_default_context(cafile=tls.ca))

    def healthy() -> bool:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "it exited"
        return trusted.get(f"{url}/healthz").status_code == 200

    try:
        eventually(healthy, timeout_s=120, what="the worker answering over https")
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        monkeypatch.setenv("CADENCE_CA_FILE", str(tls.ca))

        async def state() -> str:
            client = WorkerClient(url, "s3cret")
            try:
                return (await client.state()).worker_id
            finally:
                await client.aclose()

        assert asyncio.run(state()) == "w0"
    finally:
        trusted.close()
        proc.terminate()
        proc.wait(timeout=60)
