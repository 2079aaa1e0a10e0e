"""The resources: the shipped example validates, and a bad file is one sentence naming
the field path and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cadence.operator.api.capacity import group_plans
from cadence.operator.api.files import load
from cadence.operator.api.resources import ResourceError, RolloutPool, TrainingRun
from tests.helpers import TRAINING_RUN

EXAMPLE = TRAINING_RUN


def test_the_example_validates() -> None:
    pool, run = load(EXAMPLE)
    assert [g.name for g in pool.spec.groups] == ["h800", "a910x"]
    assert pool.spec.groups[0].price_per_hour == 2.0  # pricePerHour in YAML
    assert run.spec.scheduler.h_min == "auto" and run.spec.batch.prompts_per_batch == 8


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("accelerator: H800", "accelerator: TPU9"),
            "RolloutPool spec.groups[h800]: unknown accelerator 'TPU9'",
        ),
        (
            (
                "replicas: 2\n      pricePerHour: 2.0",
                "replicas: 99\n      maxReplicas: 4\n      pricePerHour: 2.0",
            ),
            "minReplicas <= replicas <= maxReplicas",
        ),
        (("name: a910x", "name: h800"), "group names must be unique"),
        (
            ("hMin: auto", "hMin: -1"),
            "TrainingRun spec.scheduler.hMin: must be auto or a number of tokens",
        ),
        (("policy: cadence", "policy: fifo"), "unknown policy 'fifo'"),
        (("pool: mixed", "pool: other"), "it names pool 'other'"),
        (
            ("  iterations: 30", "  iterations: 30\n    bogus: 1"),
            "spec.batch.bogus: 'bogus' is not a field here",
        ),
        (
            ("  iterations: 30", "  iterations: 30\n    promptsPerBach: 1"),
            "spec.batch.promptsPerBach: 'promptsPerBach' is not a field here; "
            "did you mean promptsPerBatch?",
        ),
        (("kind: TrainingRun", "kind: Job"), "a document of kind 'Job'"),
        (
            (
                'resources: {nvidia.com/gpu: "1"}',
                'resources: {nvidia.com/gpu: "1"}\n      engine: {tensorParallel: 2}',
            ),
            "RolloutPool spec.groups[h800]: engine.tensorParallel 2 needs 2 devices in each "
            "worker pod, but its resources request 1",
        ),
        (
            (
                "replicas: 2\n      pricePerHour: 2.0",
                "replicas: 2\n      engine: {kvTransfer: true}",
            ),
            "RolloutPool spec.groups[h800].engine.kvTransfer: 'kvTransfer' is not a field here",
        ),
        (
            ("spec:\n  groups:", "spec:\n  emulatedSpeed: 0\n  groups:"),
            "RolloutPool spec.emulatedSpeed: Input should be greater than 0",
        ),
        (
            ("spec:\n  groups:", "spec:\n  emulatedSpeed: 1.5\n  groups:"),
            "RolloutPool spec.emulatedSpeed: Input should be less than or equal to 1",
        ),
    ],
)
def test_a_bad_file_names_the_field_and_the_reason(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    text = EXAMPLE.read_text()
    assert edit[0] in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ResourceError) as e:
        load(bad)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_an_automatic_degree_never_exceeds_the_devices_a_pod_requests(tmp_path: Path) -> None:
    def plans(gpus: str) -> dict[str, tuple[int, int]]:
        # Qwen3-32B on one H800 holds about 17,000 tokens of KV: 32,768-token contexts
        # need two devices, which the planner takes only where the pods have them.
        text = EXAMPLE.read_text().replace("catalog: Qwen3-8B", "catalog: Qwen3-32B")
        text = text.replace(
            'nvidia.com/gpu: "1"',
            f'nvidia.com/gpu: "{gpus}"}}\n      engine: {{maxModelLen: 32768',
        )
        path = tmp_path / f"{gpus}.yaml"
        path.write_text(text)
        documents = list(yaml.safe_load_all(path.read_text()))
        pool = RolloutPool.model_validate(documents[0])
        run = TrainingRun.model_validate(documents[1])
        assert pool.spec.groups[0].devices == int(gpus)
        return group_plans(pool, run)

    assert plans("4")["h800"][0] > 1
    assert plans("1")["h800"][0] == 1
