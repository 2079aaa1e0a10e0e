"""The scheduler's snapshot and actions as JSON, validated by pydantic.

Snapshots cross process boundaries (the control loop can dump the one it planned on;
`cadence plan FILE` replays it), so their JSON form is checked field by field on the way
in and turned into the scheduler's own frozen dataclasses.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from cadence.scheduler.actions import Action, Admit, Advance, Evict, Place
from cadence.scheduler.snapshot import (
    Admission,
    FreshSample,
    Knobs,
    Migration,
    PendingTrajectory,
    Resident,
    Snapshot,
    Transfer,
    WorkerView,
)
from cadence.scheduler.state import CadenceState


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResidentModel(_Strict):
    id: str
    context: int = Field(ge=0)
    decoded_since_placement: int = Field(ge=0)


class WorkerModel(_Strict):
    id: str
    accelerator: str
    affinity: int
    version: int | None = Field(default=None, ge=0)
    capacity: int = Field(gt=0)
    residents: list[ResidentModel] = []
    draining: bool = False
    transfer_group: str | None = None


class PendingModel(_Strict):
    id: str
    version: int = Field(ge=0)
    context: int = Field(ge=0)
    since: float = 0.0
    placeable: bool = True
    parked_on: str | None = None


class FreshModel(_Strict):
    id: str
    group: int = Field(ge=0)
    prompt_tokens: int = Field(ge=0)


class AdmissionModel(_Strict):
    groups_admitted: int = Field(ge=0)
    batch_size: int = Field(ge=1)
    total_groups: int = Field(ge=0)


class KnobsModel(_Strict):
    h_min: int = Field(ge=0)
    delta: int = Field(ge=0)
    eta: int = Field(ge=0)
    min_decode: int = Field(default=64, ge=1)
    concentrate_without_fresh: bool = False
    migration: Migration = "auto"
    max_model_len: int | None = Field(default=None, ge=1)


class TransferModel(_Strict):
    kv_bytes_per_token: float = Field(gt=0, allow_inf_nan=False)
    link_bytes_per_s: float = Field(gt=0, allow_inf_nan=False)


class SnapshotModel(_Strict):
    now: float = 0.0
    workers: list[WorkerModel]
    pending: list[PendingModel] = []
    fresh: list[FreshModel] = []
    newest_version: int = Field(ge=0)
    admission: AdmissionModel
    knobs: KnobsModel
    seed: int = 0
    transfer: TransferModel | None = None

    def to_snapshot(self) -> Snapshot:
        return Snapshot(
            now=self.now,
            workers=tuple(
                WorkerView(
                    id=w.id,
                    accelerator=w.accelerator,
                    affinity=w.affinity,
                    version=w.version,
                    capacity=w.capacity,
                    residents=tuple(Resident(**r.model_dump()) for r in w.residents),
                    draining=w.draining,
                    transfer_group=w.transfer_group,
                )
                for w in self.workers
            ),
            pending=tuple(PendingTrajectory(**p.model_dump()) for p in self.pending),
            fresh=tuple(FreshSample(**f.model_dump()) for f in self.fresh),
            newest_version=self.newest_version,
            admission=Admission(**self.admission.model_dump()),
            knobs=Knobs(**self.knobs.model_dump()),
            seed=self.seed,
            transfer=None if self.transfer is None else Transfer(**self.transfer.model_dump()),
        )


class StateModel(_Strict):
    """The Cadence policy's state: the concentration source of each version."""

    sources: dict[int, str] = {}

    def to_state(self) -> CadenceState:
        return CadenceState.of(self.sources)

    @staticmethod
    def of(state: CadenceState) -> StateModel:
        return StateModel(sources=dict(state.sources))


def action_to_json(action: Action) -> dict[str, object]:
    """One action as a JSON object with its kind under "action"."""
    if isinstance(action, Evict):
        return {
            "action": "evict",
            "trajectory": action.trajectory,
            "worker": action.worker,
            "context": action.context,
            "reason": action.reason.value,
        }
    if isinstance(action, Place):
        return {
            "action": "place",
            "trajectory": action.trajectory,
            "worker": action.worker,
            "version": action.version,
            "context": action.context,
        }
    if isinstance(action, Advance):
        return {"action": "advance", "worker": action.worker, "version": action.version}
    assert isinstance(action, Admit)
    return {"action": "admit", "groups": action.groups}


def actions_to_json(actions: Sequence[Action]) -> list[dict[str, object]]:
    return [action_to_json(a) for a in actions]
