"""What vLLM's engine reports about itself, read as it reports it.

The async engine runs its scheduler in another process, so its KV use cannot be read
from the block pool directly; it arrives with every step's scheduler statistics. A stat
logger (vLLM's interface for custom metrics sinks) keeps the latest figures here.
Imported only where vLLM runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase

if TYPE_CHECKING:  # the engine module imports this one once vLLM is loaded
    from cadence.worker.vllm_engine import EngineStats


class StatsSink(StatLoggerBase):
    def __init__(self, stats: EngineStats) -> None:
        self.stats = stats

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        stats = self.stats
        if scheduler_stats is not None:
            stats.kv_usage = float(scheduler_stats.kv_cache_usage)
            stats.prefix_queries += int(scheduler_stats.prefix_cache_stats.queries)
            stats.prefix_hits += int(scheduler_stats.prefix_cache_stats.hits)
            stats.steps += 1
        if iteration_stats is not None:
            stats.preemptions += int(iteration_stats.num_preempted_reqs)
        if scheduler_stats is None or iteration_stats is None:
            return
        # A busy engine core steps back to back, so the time between two steps' outputs is
        # the later step's. A step after an idle spell, or one that also prefilled, is
        # not a decode step's sample.
        at = float(iteration_stats.iteration_timestamp)
        batch = int(scheduler_stats.num_running_reqs)
        decoded = int(iteration_stats.num_generation_tokens)
        prefilled = int(iteration_stats.prompt_token_stats.computed)
        if stats.last_step_at is not None and decoded and not prefilled:
            context = round(stats.kv_usage * stats.capacity_tokens)
            stats.decode.add(batch, context, at - stats.last_step_at)
        stats.last_step_at = at if batch else None

    def log_engine_initialized(self) -> None:
        pass


def factory(stats: EngineStats) -> Any:
    """A per-engine stat logger factory for `AsyncLLM(stat_loggers=[...])`."""

    def make(vllm_config: VllmConfig, engine_index: int = 0) -> StatsSink:
        return StatsSink(stats)

    return make
