"""The custom resources (`RolloutPool`, `TrainingRun`, `RolloutGroup`) as pydantic models,
and what a run's spec implies: each group's KV capacity and the stranding check
(`capacity.py`), the scheduler's knobs and the trainer's config (`settings.py`). The
operator and `cadence run` read the same files through these."""
