"""A Cadence pool as the rollout backend of TRL's `AsyncGRPOTrainer`.

TRL's asynchronous GRPO trainer takes a rollout worker and a weight transfer object;
`CadenceRolloutWorker` and `CadenceWeightTransfer` are those two for a Cadence run in
external-trainer mode. The worker submits the trainer's prompts to the run and turns each
whole batch Cadence delivers into TRL's rollout samples; the weight transfer publishes
each new policy to the run, whose workers advance to it. `check_agreement` refuses, in
one sentence naming both settings, a TRL configuration the run would not honour;
`agreeing` gives the settings that agree.

Install with `pip install "cadence[trl]"`; the versions tested are in pyproject.toml."""

from cadence.integrations.trl.agreement import Disagreement, agreeing, check_agreement
from cadence.integrations.trl.invitation import Invitation, NoInvitation, wait_for_invitation
from cadence.integrations.trl.rollout import CadenceRolloutWorker, run_settings
from cadence.integrations.trl.weights import CadenceWeightTransfer

__all__ = [
    "CadenceRolloutWorker",
    "CadenceWeightTransfer",
    "Disagreement",
    "Invitation",
    "NoInvitation",
    "agreeing",
    "check_agreement",
    "run_settings",
    "wait_for_invitation",
]
