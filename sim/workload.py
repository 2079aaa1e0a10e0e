"""Synthetic RL rollout workloads: prompt groups of samples with heavy-tailed lengths.

Response lengths follow a law, capped at the room `max_model_len` leaves after the prompt
and correlated within a prompt's group (a hard prompt makes every sample long):

- `LengthModel`, the default: a lognormal body; each group draws its own log-median, each
  sample its own spread around it. Published shape targets (docs/simulator.md, "Workload
  shape"): p99 about 10x the median, and the slowest 10% of trajectories taking about
  half of a rollout's wall time. `shape_of` reports what a generated workload gives.
- `MixtureLengths`: several lognormal components (reasoning workloads mix short answers
  with long chains of thought), each sample drawing its component by weight; a group's
  difficulty (one normal draw) shifts every component's log-median alike.
- `EmpiricalLengths`: a team's own length histogram replayed. A Gaussian copula keeps the
  within-group correlation: a group draws z_g, a sample z = sqrt(rho) z_g +
  sqrt(1 - rho) e, and takes the length at quantile Phi(z) of the recorded lengths.

Multi-turn tasks: a sample makes up to `max_tool_calls` tool calls at points spread over
its response; each call sends it to its environment for a latency drawn from a law
(exponential by default, lognormal or empirical), and the observation appended on its
return adds tokens to its context.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

Draw = Callable[[random.Random], float]


class LengthLaw(Protocol):
    """Response lengths: `start_group` draws what a group shares and returns the drawer
    of its samples' lengths (tokens, before the cap)."""

    def start_group(self, rng: random.Random) -> Draw: ...


@dataclass(frozen=True, slots=True)
class LengthModel:
    """Lognormal response lengths: median, spread between groups and within a group."""

    median_tokens: float
    sigma_between: float = 0.75
    sigma_within: float = 0.6

    @property
    def sigma(self) -> float:
        """The spread of one sample's log-length over all groups."""
        return math.hypot(self.sigma_between, self.sigma_within)

    def start_group(self, rng: random.Random) -> Draw:
        mu = math.log(self.median_tokens) + rng.gauss(0.0, self.sigma_between)
        sigma = self.sigma_within
        return lambda r: math.exp(r.gauss(mu, sigma))


@dataclass(frozen=True, slots=True)
class Component:
    """One lognormal component of a mixture, with its share of the samples."""

    weight: float
    median_tokens: float
    sigma_between: float = 0.5
    sigma_within: float = 0.5


@dataclass(frozen=True, slots=True)
class MixtureLengths:
    components: tuple[Component, ...]
    _cumulative: tuple[float, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        total, cumulative = 0.0, []
        for c in self.components:
            total += c.weight
            cumulative.append(total)
        object.__setattr__(self, "_cumulative", tuple(x / total for x in cumulative))

    def start_group(self, rng: random.Random) -> Draw:
        difficulty = rng.gauss(0.0, 1.0)
        last = len(self.components) - 1

        def draw(r: random.Random) -> float:
            c = self.components[min(last, bisect.bisect_right(self._cumulative, r.random()))]
            mu = math.log(c.median_tokens) + c.sigma_between * difficulty
            return math.exp(r.gauss(mu, c.sigma_within))

        return draw


@dataclass(frozen=True, slots=True)
class EmpiricalLengths:
    """Lengths replayed from a recorded distribution (sorted ascending on construction)."""

    lengths: tuple[float, ...]
    group_correlation: float = 0.6

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(sorted(self.lengths)))

    def start_group(self, rng: random.Random) -> Draw:
        shared = math.sqrt(self.group_correlation) * rng.gauss(0.0, 1.0)
        own = math.sqrt(1.0 - self.group_correlation)
        values, n = self.lengths, len(self.lengths)

        def draw(r: random.Random) -> float:
            u = _PHI.cdf(shared + own * r.gauss(0.0, 1.0))
            return values[min(n - 1, int(u * n))]

        return draw


_PHI = NormalDist()


class LatencyLaw(Protocol):
    """An environment's response time for one tool call, in seconds."""

    def draw(self, rng: random.Random) -> float: ...


@dataclass(frozen=True, slots=True)
class Exponential:
    mean_s: float

    def draw(self, rng: random.Random) -> float:
        return rng.expovariate(1.0 / self.mean_s) if self.mean_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Lognormal:
    median_s: float
    sigma: float

    def draw(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.median_s), self.sigma)


@dataclass(frozen=True, slots=True)
class Empirical:
    values: Sequence[float]

    def draw(self, rng: random.Random) -> float:
        return self.values[rng.randrange(len(self.values))]


@dataclass(frozen=True, slots=True)
class MultiTurn:
    """Tool use: the chance a sample uses tools, and how it does."""

    share: float = 0.0  # fraction of samples that are multi-turn
    max_tool_calls: int = 12
    latency: LatencyLaw = Exponential(2.0)
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
    lengths: LengthLaw,
    max_model_len: int,
    multi_turn: MultiTurn,
    scale: float = 1.0,
) -> list[Sample]:
    """The `samples` of prompt group `group`, each response `scale` times its draw."""
    room = max(1, max_model_len - prompt_tokens)
    draw = lengths.start_group(rng)
    out = []
    for s in range(samples):
        n = max(1, min(room, int(draw(rng) * scale)))
        calls: tuple[int, ...] = ()
        latencies: tuple[float, ...] = ()
        observation = 0
        if multi_turn.share > 0 and rng.random() < multi_turn.share:
            k = rng.randint(1, multi_turn.max_tool_calls)
            observation = multi_turn.observation_tokens
            # Observations take room too: keep the whole context within max_model_len.
            n = max(1, min(n, room - k * observation))
            calls = tuple(sorted({rng.randint(1, max(1, n - 1)) for _ in range(k)}))
            latencies = tuple(multi_turn.latency.draw(rng) for _ in calls)
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
