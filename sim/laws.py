"""The laws a scenario draws lengths and environment latencies from, as its file writes
them (lognormal, a mixture, recorded values; exponential, lognormal, recorded), and how
recorded values are read. `workload.py` turns them into draws."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cadence.sim.workload import (
    Component,
    Empirical,
    EmpiricalLengths,
    Exponential,
    LatencyLaw,
    LengthLaw,
    LengthModel,
    Lognormal,
    MixtureLengths,
)

# Upper bounds on what a scenario may ask for: far above any real pool or workload, low
# enough that no file can ask for a run that does not end.

# Upper bounds on what a scenario may ask for: far above any real pool or workload, low
# enough that no file can ask for a run that does not end.
MAX_DEVICES = 4_096
MAX_TOKENS = 1 << 21
MAX_SECONDS = 86_400.0 * 7


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def read_numbers(path: Path, field: str | None) -> list[float]:
    """Positive numbers recorded one a line, or under `field` of each JSON line; a
    ValueError names the file, the line and what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    out: list[float] = []
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            raw: Any = json.loads(line)[field] if field is not None else float(line)
            value = float(raw)
        except (ValueError, KeyError, TypeError, IndexError):
            what = f"a JSON object with a number under {field!r}" if field else "a number"
            raise ValueError(f"{path} line {number} is not {what}: {line[:40]!r}") from None
        if not 0 < value < float("inf"):
            raise ValueError(f"{path} line {number}: {line[:40]!r} is not a positive number")
        out.append(value)
    if not out:
        raise ValueError(f"{path} holds no numbers")
    return out


def _resolve(path: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base")
    return path if path.is_absolute() or base is None else Path(base) / path


class LognormalLengths(Strict):
    """The default law, spelled out: a lognormal per group around `median_tokens`."""

    law: Literal["lognormal"]
    median_tokens: float = Field(gt=0, le=MAX_TOKENS)
    sigma_between_groups: float = Field(default=0.75, ge=0, le=5)
    sigma_within_group: float = Field(default=0.6, ge=0, le=5)

    def build(self) -> LengthLaw:
        return LengthModel(self.median_tokens, self.sigma_between_groups, self.sigma_within_group)


class MixtureComponent(Strict):
    weight: float = Field(gt=0, le=1e6)
    median_tokens: float = Field(gt=0, le=MAX_TOKENS)
    sigma_between_groups: float = Field(default=0.5, ge=0, le=5)
    sigma_within_group: float = Field(default=0.5, ge=0, le=5)


class MixtureLengthsSpec(Strict):
    """Lognormal components, each sample drawing one by weight (e.g. 70% short answers
    around 800 tokens, 30% long reasoning around 12K)."""

    law: Literal["mixture"]
    components: list[MixtureComponent] = Field(min_length=1, max_length=64)

    def build(self) -> LengthLaw:
        return MixtureLengths(
            tuple(
                Component(c.weight, c.median_tokens, c.sigma_between_groups, c.sigma_within_group)
                for c in self.components
            )
        )


class _Recorded(Strict):
    """Numbers a team recorded: `path` holds one a line, or JSON lines with the number
    under `field`, read once when the scenario is validated; or `values`, inline."""

    path: Path | None = None
    field: str | None = None
    values: list[Annotated[float, Field(gt=0)]] = Field(default=[], max_length=1_000_000)
    _values: tuple[float, ...] = PrivateAttr(default=())

    @field_validator("path")
    @classmethod
    def _relative_to_scenario(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        return None if path is None else _resolve(path, info)

    @model_validator(mode="after")
    def _read(self) -> Self:
        if (self.path is None) == (not self.values):
            raise ValueError("give either path (a file of numbers) or values, not both")
        if self.path is not None:
            self._values = tuple(read_numbers(self.path, self.field))
        else:
            self._values = tuple(self.values)
        return self


class EmpiricalLengthsSpec(_Recorded):
    """A recorded length histogram, replayed with the given within-group correlation."""

    law: Literal["empirical"]
    group_correlation: float = Field(default=0.6, ge=0, le=1)

    def build(self) -> LengthLaw:
        return EmpiricalLengths(self._values, self.group_correlation)


LengthLawSpec = Annotated[
    LognormalLengths | MixtureLengthsSpec | EmpiricalLengthsSpec, Field(discriminator="law")
]


class ExponentialLatency(Strict):
    law: Literal["exponential"]
    mean_s: float = Field(ge=0, le=MAX_SECONDS)

    def build(self) -> LatencyLaw:
        return Exponential(self.mean_s)


class LognormalLatency(Strict):
    law: Literal["lognormal"]
    median_s: float = Field(gt=0, le=MAX_SECONDS)
    sigma: float = Field(default=1.0, ge=0, le=5)

    def build(self) -> LatencyLaw:
        return Lognormal(self.median_s, self.sigma)


class EmpiricalLatency(_Recorded):
    """Recorded tool-call latencies, in seconds."""

    law: Literal["empirical"]

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        if max(self._values) > MAX_SECONDS:
            raise ValueError(f"{self.path} holds a latency above {MAX_SECONDS:.0f} s")
        return self

    def build(self) -> LatencyLaw:
        return Empirical(self._values)


LatencyLawSpec = Annotated[
    ExponentialLatency | LognormalLatency | EmpiricalLatency, Field(discriminator="law")
]
