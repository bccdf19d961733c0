"""The stacked engine's per-machine plan (largeprompt.icl.engine.tuning, docs/performance.md#training-step)."""
import json

import pytest
import torch

from largeprompt.icl.engine import stacked, tuning
from largeprompt.kernel import autotune
from largeprompt.kernel.kernel_cache import cache_file


@pytest.fixture(autouse=True)
def fresh_choices(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(tuning.ENV_PLAN, raising=False)
    autotune.forget()
    yield
    autotune.forget()


def test_a_plan_is_tuned_once_cached_and_recorded_for_provenance():
    plan = tuning.plan_for(3, 20, 16, 4, torch.float64)
    assert plan in tuning.candidates(4, 16)  # S = 3 is tuned in its bucket, 4
    regime = tuning.regime_key(3, 20, 16, 4, torch.float64, "cpu")
    entry = json.loads(cache_file().read_text())["machines"][autotune.machine_key()][regime]
    assert entry["plan"] == str(plan) and set(entry["seconds"]) == {str(p) for p in tuning.candidates(4, 16)}
    assert autotune.kernels_used()[regime] == str(plan) and autotune.kernel_sources()[regime] == "tuned"
    autotune.forget()
    assert tuning.plan_for(3, 20, 16, 4, torch.float64) == plan and autotune.kernel_sources()[regime] == "cache"


def test_the_environment_wins_and_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(tuning.ENV_PLAN, "block=7,exp=2")
    assert tuning.plan_for(2, 10, 32, 4, torch.float32) == stacked.Plan(7, True)
    assert not cache_file().exists()  # nothing tuned
    monkeypatch.setenv(tuning.ENV_PLAN, "block=7,exp=10")
    with pytest.raises(ValueError, match=tuning.ENV_PLAN):
        tuning.plan_for(2, 10, 32, 4, torch.float32)


def test_linear_runs_only_are_tuned_in_base_e_and_blocks_never_exceed_the_batch():
    assert {p.base2 for p in tuning.candidates(0, 16)} == {False}
    assert max(p.block for p in tuning.candidates(2, 16)) == 16
    assert {p.base2 for p in tuning.candidates(2, 16)} == {False, True}


def test_a_large_batch_is_tuned_on_at_most_the_tuning_batch():
    plan, seconds = tuning.tune(2, 16, 1 << 15, 4, torch.float32)
    assert set(seconds) == set(tuning.candidates(2, tuning.TUNING_BATCH)) and plan.block <= tuning.TUNING_BATCH
