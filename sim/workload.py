"""Synthetic RL rollout workloads: prompt groups of samples with heavy-tailed lengths.

Response lengths follow a lognormal body capped at the room `max_model_len` leaves after
the prompt, correlated within a prompt's group (a hard prompt makes every sample long):
each group draws its own log-median, each sample its own spread around it. Published
shape targets (CATALOG.md, "Workload shape"): p99 about 10x the median, and the slowest
10% of trajectories taking about half of a rollout's wall time. `shape_of` reports what a
generated workload actually gives, so scenarios can state it.

Multi-turn tasks: a sample makes up to `max_tool_calls` tool calls at points spread over
its response; each call sends it to its environment for a drawn latency, and the
observation appended on its return adds tokens to its context.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LengthModel:
    """Lognormal response lengths: median, spread between groups and within a group."""

    median_tokens: float
    sigma_between: float = 0.75
    sigma_within: float = 0.6
    max_model_len: int = 32_768

    @property
    def sigma(self) -> float:
        """The spread of one sample's log-length over all groups."""
        return math.hypot(self.sigma_between, self.sigma_within)


@dataclass(frozen=True, slots=True)
class MultiTurn:
    """Tool use: the chance a sample uses tools, and how it does."""

    share: float = 0.0  # fraction of samples that are multi-turn
    max_tool_calls: int = 12
    env_latency_s: float = 2.0  # mean of an exponential
    observation_tokens: int = 128


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of a prompt group: everything the simulator needs to play it out."""

    id: str
    group: int
    prompt_tokens: int
    response_tokens: int
    # Generated-token counts at which it calls a tool, ascending, each < response_tokens.
    tool_calls: tuple[int, ...]
    env_latencies_s: tuple[float, ...]
    observation_tokens: int


def generate_group(
    rng: random.Random,
    group: int,
    samples: int,
    *,
    prompt_tokens: int,
    lengths: LengthModel,
    multi_turn: MultiTurn,
) -> list[Sample]:
    """The `samples` of prompt group `group`."""
    room = max(1, lengths.max_model_len - prompt_tokens)
    mu = math.log(lengths.median_tokens) + rng.gauss(0.0, lengths.sigma_between)
    out = []
    for s in range(samples):
        n = max(1, min(room, int(math.exp(rng.gauss(mu, lengths.sigma_within)))))
        calls: tuple[int, ...] = ()
        latencies: tuple[float, ...] = ()
        observation = 0
        if multi_turn.share > 0 and rng.random() < multi_turn.share:
            k = rng.randint(1, multi_turn.max_tool_calls)
            observation = multi_turn.observation_tokens
            # Observations take room too: keep the whole context within max_model_len.
            n = max(1, min(n, room - k * observation))
            calls = tuple(sorted({rng.randint(1, max(1, n - 1)) for _ in range(k)}))
            latencies = tuple(rng.expovariate(1.0 / multi_turn.env_latency_s) for _ in calls)
        out.append(Sample(f"g{group}s{s}", group, prompt_tokens, n, calls, latencies, observation))
    return out


@dataclass(frozen=True, slots=True)
class Shape:
    """What a workload's lengths look like against the published targets."""

    median: float
    p99_over_median: float
    # By length alone (completion time proportional to length at a constant per-token
    # speed): the share of a synchronous rollout's time spent on its slowest 10%. An
    # upper bound: a real tail decodes faster per token as co-residents finish, which the
    # simulator's own measurement shows.
    slowest_tenth_time_share: float
    capped_share: float


def _quantile(ordered: list[int], q: float) -> float:
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def shape_of(samples: list[Sample], max_model_len: int) -> Shape:
    ordered = sorted(s.response_tokens for s in samples)
    median = _quantile(ordered, 0.5)
    p90, p99, longest = _quantile(ordered, 0.9), _quantile(ordered, 0.99), float(ordered[-1])
    capped = sum(1 for s in samples if s.prompt_tokens + s.response_tokens >= max_model_len)
    return Shape(
        median=median,
        p99_over_median=p99 / median,
        slowest_tenth_time_share=(longest - p90) / longest,
        capped_share=capped / len(samples),
    )
