"""The custom resources, once: `RolloutPool`, `RolloutGroup` and `TrainingRun` (group
`cadence.dev`, version `v1alpha1`) as pydantic models. `cadence run` validates a YAML
file with them and the operator serves them as CRDs generated from them, so one model
validates both paths.

One module a kind (`pool`, `group`, `run`), what they share (`base`) and what the
operator writes (`status`); this module is the one import their users need. Rules within
one resource are checked by its model; rules across resources or needing the catalog (a
trajectory of `maxModelLen` must fit every group under `hMin + delta`) by `capacity`. A
bad file is one sentence naming the field path (`ResourceError`).
"""

from cadence.operator.api.base import (
    API_VERSION,
    GROUP,
    IMAGE,
    MAX_LENGTH,
    POOL_NAME_RULES,
    RUN_NAME_RULES,
    VERSION,
    Metadata,
    ResourceError,
    as_written,
)
from cadence.operator.api.group import (
    RolloutGroup,
    RolloutGroupSpec,
    RolloutGroupStatus,
    groups_of,
)
from cadence.operator.api.pool import (
    EngineSettings,
    GroupSettings,
    PodOverlay,
    PoolGroup,
    RolloutPool,
    RolloutPoolSpec,
    Toleration,
)
from cadence.operator.api.run import (
    SIZING_DELTA,
    SIZING_H_MIN,
    BatchSpec,
    CompletionSpec,
    MultiTurnSpec,
    ResponseLengths,
    SchedulerSpec,
    TrainingRun,
    TrainingRunSpec,
)
from cadence.operator.api.status import (
    Condition,
    GroupStatus,
    RolloutPoolStatus,
    TrainingRunStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "IMAGE",
    "MAX_LENGTH",
    "POOL_NAME_RULES",
    "RUN_NAME_RULES",
    "SIZING_DELTA",
    "SIZING_H_MIN",
    "VERSION",
    "BatchSpec",
    "CompletionSpec",
    "Condition",
    "EngineSettings",
    "GroupSettings",
    "GroupStatus",
    "Metadata",
    "MultiTurnSpec",
    "PodOverlay",
    "PoolGroup",
    "ResourceError",
    "ResponseLengths",
    "RolloutGroup",
    "RolloutGroupSpec",
    "RolloutGroupStatus",
    "RolloutPool",
    "RolloutPoolSpec",
    "RolloutPoolStatus",
    "SchedulerSpec",
    "Toleration",
    "TrainingRun",
    "TrainingRunSpec",
    "TrainingRunStatus",
    "as_written",
    "groups_of",
]
