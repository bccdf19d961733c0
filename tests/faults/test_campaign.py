"""The short fault-injection campaign (tests/faults/campaign.py, docs/reliability.md): one trial of every local
fault, in one throwaway copy of the repository whose smoke run is the reference. The SLURM faults (1-4 min each)
run with LARGEPROMPT_SLURM_FAULTS=1 and in the standalone campaign (docs/reliability.md#open-problems).
Asserts that no reference file is lost and that every fault survived every trial; a fault that cannot run here (no
tmpfs, no SLURM) is skipped with its reason. A fault that fails only in a way documented as a known bug in
docs/reliability.md is reported as xfail, never as passed; its data lost is asserted all the same."""
from __future__ import annotations

import os

import numpy as np
import pytest
from campaign import FAULTS, GROUPS, close, prepare, run_faults
from fault_slurm import Cluster, _skip_reason

pytestmark = [pytest.mark.slow, pytest.mark.pipeline]

TRIALS, SLURM_TRIALS = 1, 1
# Known bugs outside this repository (docs/reliability.md#open-problems): fault key -> the problem line a trial
# reports for it. None today: the scancel'd job that sacct reports as 'CANCELLED by <uid>' is read from squeue
# (workflow/profiles/slurm/config.yaml).
KNOWN: dict[str, str] = {}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """The workspace with its reference (and the forced training run's wall time), one seed, closed at the end."""
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"campaign seed {seed}")
    ctx = prepare(tmp_path_factory.mktemp("faults"), FAULTS, print)
    yield ctx, seed
    close(ctx, print)


def _check(results, known=None):
    summary = "\n".join(r.line() + "".join(f"\n    {p}" for t in r.trials for p in t.problems) for r in results)
    print(summary)
    assert sum(r.lost for r in results) == 0, summary
    failed = [r for r in results if not r.skipped and not r.ok]
    if failed and known and all(known in p for r in failed for t in r.trials for p in t.problems):
        pytest.xfail(f"known bug ({known}):\n{summary}")
    assert not failed, summary


def test_local_faults(campaign):
    ctx, seed = campaign
    faults = [f for f in FAULTS if f.key in GROUPS["local"]]
    _check(run_faults(ctx, faults, TRIALS, seed, print))


@pytest.mark.slurm
@pytest.mark.parametrize("key", sorted(GROUPS["slurm"]))
def test_slurm_fault(campaign, key):
    if os.environ.get("LARGEPROMPT_SLURM_FAULTS") != "1":
        pytest.skip("SLURM faults run with LARGEPROMPT_SLURM_FAULTS=1 or `tests/faults/campaign.py --only slurm`")
    if _skip_reason():
        pytest.skip(_skip_reason())
    ctx, seed = campaign
    if ctx.cluster is None:
        ctx.cluster = Cluster.start(ctx.ws, print)
    if ctx.cluster.skipped:
        pytest.skip(ctx.cluster.skipped)
    fault = next(f for f in FAULTS if f.key == key)
    _check(run_faults(ctx, [fault], TRIALS, seed, print, slurm_trials=SLURM_TRIALS), KNOWN.get(key))
