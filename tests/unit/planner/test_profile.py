"""Profile JSON (tandem.profile/1): round trips, and what a loader refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.planner.devices import get_device
from tandem.planner.models import get_model
from tandem.planner.profile import SCHEMA, Profile, ProfileError, StepCost, Transfer
from tandem.planner.roofline import roofline_profile


def _profile() -> Profile:
    return roofline_profile(get_model("Llama-3.1-70B"), get_device("H100-SXM"),
                            gpus_per_worker=4)


def test_save_load_round_trip(tmp_path: Path) -> None:
    profile = _profile()
    path = tmp_path / "p.json"
    profile.save(path)
    assert Profile.load(path) == profile
    assert json.loads(path.read_text())["schema"] == SCHEMA


def test_json_round_trip_of_a_measured_profile() -> None:
    profile = Profile(model="m", device="cpu", step=StepCost(0.01, 1e-4, 2e-5, 1e-8),
                      transfer=Transfer(1e9, 1e-3), kv_bytes_per_token=1024,
                      kv_capacity_tokens=4096, samples={"steps": [[1, 0, 0, 0.01]]})
    assert Profile.from_json(json.loads(json.dumps(profile.to_json()))) == profile


def test_unknown_field_refused() -> None:
    data = _profile().to_json()
    data["gpu_count"] = 4
    with pytest.raises(ProfileError, match="gpu_count"):
        Profile.from_json(data)


@pytest.mark.parametrize("schema", [None, "tandem.profile/0", "tandem.profile/2"])
def test_wrong_schema_refused(schema: str | None) -> None:
    data = _profile().to_json()
    data["schema"] = schema
    with pytest.raises(ProfileError, match="schema"):
        Profile.from_json(data)


def test_missing_field_and_bad_values_refused() -> None:
    data = _profile().to_json()
    del data["kv_capacity_tokens"]
    with pytest.raises(ProfileError):
        Profile.from_json(data)
    data = _profile().to_json()
    data["step"]["per_row_s"] = -1.0
    with pytest.raises(ProfileError, match=">= 0"):
        Profile.from_json(data)
    data = _profile().to_json()
    data["source"] = "guessed"
    with pytest.raises(ProfileError, match="source"):
        Profile.from_json(data)
    data = _profile().to_json()
    data["serving_prompt_scale"] = 0.0
    with pytest.raises(ProfileError, match="serving_prompt_scale"):
        Profile.from_json(data)
    data = _profile().to_json()
    del data["serving_prompt_scale"]  # a profile written before the field: 1
    assert Profile.from_json(data).serving_prompt_scale == 1.0


def test_unreadable_file_is_a_profile_error(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="cannot read"):
        Profile.load(path)
    with pytest.raises(ProfileError, match="JSON object"):
        Profile.from_json([1, 2])  # type: ignore[arg-type]


def test_a_scaled_step_costs_the_factor_times_at_every_shape() -> None:
    step = StepCost(0.01, 0.002, 0.001, 1e-6, 1e-9, ((1, 0.012), (8, 0.03), (64, 0.2)), 4e-4)
    slower = step.scaled(1.25)
    for shape in ((1, 0, 0), (3, 0, 900), (8, 120, 4000, 7000), (100, 0, 0)):
        assert slower.step_s(*shape) == pytest.approx(1.25 * step.step_s(*shape))
    linear = StepCost(0.01, 0.002, 0.001, 1e-6, 1e-9)
    assert linear.scaled(0.5).step_s(4, 64, 100, 2000) == pytest.approx(
        0.5 * linear.step_s(4, 64, 100, 2000))
    with pytest.raises(ProfileError, match="> 0"):
        step.scaled(0.0)
