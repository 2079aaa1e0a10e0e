"""Bounds every component shares, so that a run one part accepts, every other part
accepts too: the TrainingRun's schema, the trainer's configuration and the simulator's
workload (which a run's trace header is) take the same figures. Each is far beyond
what a real run needs; it exists so that nothing downstream overflows."""

from __future__ import annotations

MAX_ITERATIONS = 1_000_000  # batches a run trains: RL runs go for thousands
MAX_ETA = 1_000  # the staleness bound, in versions
MAX_PROMPTS_PER_BATCH = 65_536
MAX_SAMPLES_PER_PROMPT = 1_024
