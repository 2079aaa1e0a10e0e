"""A file holding one RolloutPool and one TrainingRun, as `cadence run`, `cadence sim
--run` and the benches take it: read, each resource validated, then the pair checked
together (capacity included), so a bad file is refused in one sentence before anything
starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from cadence.common.complaints import first_complaint
from cadence.common.inputs import read_input
from cadence.operator.api.capacity import check_budget, check_pair
from cadence.operator.api.resources import ResourceError, RolloutPool, TrainingRun
from cadence.operator.api.simulate import scenario_of


def _where(e: ValidationError, kind: str, data: object, model: type[BaseModel]) -> str:
    path, message = first_complaint(e, data, model)
    return f"{kind} {path}: {message}" if path else f"{kind}: {message}"


def load(path: Path) -> tuple[RolloutPool, TrainingRun]:
    """A YAML file holding one RolloutPool and one TrainingRun (any order)."""
    try:
        text = read_input(path).decode("utf-8")
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except OSError as e:
        raise ResourceError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ResourceError(f"{path} is not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise ResourceError(f"{path} is not YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise ResourceError(f"{path} nests too deeply to read") from None
    found: dict[str, Any] = {}
    for d in documents:
        kind = d.get("kind") if isinstance(d, dict) else None
        if kind not in ("RolloutPool", "TrainingRun"):
            raise ResourceError(
                f"{path}: a document of kind {kind!r}; expected RolloutPool or TrainingRun"
            )
        if kind in found:
            raise ResourceError(f"{path} holds more than one {kind}")
        model = RolloutPool if kind == "RolloutPool" else TrainingRun
        try:
            found[kind] = model.model_validate(d)
        except ValidationError as e:
            raise ResourceError(_where(e, kind, d, model)) from None
    for kind in ("RolloutPool", "TrainingRun"):
        if kind not in found:
            raise ResourceError(f"{path} holds no {kind}")
    pool, run = found["RolloutPool"], found["TrainingRun"]
    check_budget(pool)
    check_pair(pool, run)
    try:  # a run's trace header is this scenario: a run it cannot hold stops here
        scenario_of(pool, run)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ResourceError(
            f"{path}: the simulator cannot model this run (scenario {where}: {err['msg']})"
        ) from None
    return pool, run
