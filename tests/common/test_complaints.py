"""Refusals name what the user wrote: list items by name, a mistyped field with the
nearest one the model knows."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cadence.cli import main
from cadence.common.complaints import first_complaint, where
from tests.helpers import SCENARIO_DIR


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    devices: int = Field(ge=1)


class _Pool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    groups: list[_Group]
    prompts_per_batch: int = 1


def _complaint(data: Mapping[str, object]) -> tuple[str, str]:
    with pytest.raises(ValidationError) as e:
        _Pool.model_validate(data)
    return first_complaint(e.value, data, _Pool)


def test_a_list_item_is_named_by_its_name_and_by_its_index_without_one() -> None:
    data = {"groups": [{"name": "h800", "devices": 8}, {"name": "l40s", "devices": 0}]}
    assert _complaint(data)[0] == "groups[l40s].devices"
    assert where(("groups", 1, "devices"), {"groups": [{}, {"devices": 0}]}) == "groups[1].devices"
    assert where(("groups", 5), {"groups": []}) == "groups[5]"


def test_an_unknown_field_suggests_the_nearest_known_one_at_its_place() -> None:
    at, message = _complaint({"groups": [], "prompt_per_batch": 8})
    assert at == "prompt_per_batch"
    assert message == "'prompt_per_batch' is not a field here; did you mean prompts_per_batch?"
    at, message = _complaint({"groups": [{"name": "a", "devicez": 2, "devices": 1}]})
    assert (at, message) == (
        "groups[a].devicez",
        "'devicez' is not a field here; did you mean devices?",
    )
    assert _complaint({"groups": [], "colour": 1})[1] == "'colour' is not a field here"


def test_cadence_sim_names_the_group_and_the_field_it_guesses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = yaml.safe_load((SCENARIO_DIR / "seed-16A16B8H.yaml").read_text())
    scenario["groups"][1]["devices"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(scenario))
    assert main(["sim", "--scenario", str(bad)]) == 2
    name = scenario["groups"][1]["name"]
    assert f"invalid at groups[{name}].devices" in capsys.readouterr().err
    scenario["groups"][1]["devices"] = 8
    scenario["workload"]["prompt_per_batch"] = 8
    bad.write_text(yaml.safe_dump(scenario))
    assert main(["sim", "--scenario", str(bad)]) == 2
    assert "did you mean prompts_per_batch?" in capsys.readouterr().err
