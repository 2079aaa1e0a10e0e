"""The pacing and concentration scheduler, as a pure library.

`plan(snapshot, state) -> (actions, state)` is the whole interface: the simulator, the
single-machine runtime and the operator build a `Snapshot`, call a policy, and apply the
returned `Evict`, `Place`, `Advance` and `Admit` actions themselves.
"""

from cadence.scheduler.actions import (
    Action,
    Admit,
    Advance,
    Evict,
    EvictReason,
    Place,
)
from cadence.scheduler.cadence import CadencePolicy, plan
from cadence.scheduler.cost import StepCost
from cadence.scheduler.errors import ConfigError, StrandingError
from cadence.scheduler.policy import Policy
from cadence.scheduler.snapshot import (
    Admission,
    FreshSample,
    Knobs,
    PendingTrajectory,
    Resident,
    Snapshot,
    WorkerView,
)
from cadence.scheduler.state import CadenceState
from cadence.scheduler.validation import check_no_stranding, required_capacity

__all__ = [
    "Action",
    "Admission",
    "Admit",
    "Advance",
    "CadencePolicy",
    "CadenceState",
    "ConfigError",
    "Evict",
    "EvictReason",
    "FreshSample",
    "Knobs",
    "PendingTrajectory",
    "Place",
    "Policy",
    "Resident",
    "Snapshot",
    "StepCost",
    "StrandingError",
    "WorkerView",
    "check_no_stranding",
    "plan",
    "required_capacity",
]
