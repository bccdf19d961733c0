"""Runs share what they can (docs/architecture.md#sharing-results): with `--cache`, an overlay under a new run name
that changes one figure's parameter recomputes only the jobs that parameter reaches; everything else is fetched."""
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from helpers import copy_repo, run, snakemake_cmd


@pytest.mark.slow
def test_an_overlay_under_a_new_run_name_recomputes_only_what_its_change_reaches(tmp_path):
    work = copy_repo(tmp_path / "repo")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    env = {"SNAKEMAKE_OUTPUT_CACHE": str(tmp_path / "cache")}
    run(snakemake_cmd("--cores", "2", "--cache", "--configfile", "config/smoke.yaml"), cwd=work, timeout=1200, env=env)
    overlay = work / "config" / "shared.yaml"
    overlay.write_text("run: shared\naffine_limit:\n  n_prompts: 21\n")  # smoke has 20
    proc = run(snakemake_cmd("--cores", "2", "--cache", "--configfile", "config/smoke.yaml", "config/shared.yaml"),
               cwd=work, timeout=1200, env=env)
    # A job fetched from the cache runs no script; Snakemake still creates its log file, empty.
    computed = {p.relative_to(work / "logs" / "shared").as_posix() for p in (work / "logs" / "shared").rglob("*.log")
                if p.stat().st_size > 0}
    figures = {p for p in computed if p.startswith("figures/")}
    # the one compute job n_prompts reaches, and the claims ledger, which reads its table, with its numbers.tex
    # (summaries, never cached)
    assert computed - figures == {"affine_limit/simulate_affine_limit.log", "claims/evaluate_claims.log",
                                  "claims/write_numbers.log"}, computed
    assert len(figures) == 10  # every figure of the new run is drawn: each names its run
    assert "from cache" in proc.stdout + proc.stderr
    mine, theirs = (work / "results" / run_name / "affine_limit" / "outputs.parquet" for run_name in ("shared", "smoke"))
    assert pd.read_parquet(mine)["prompt"].nunique() == 21 and pd.read_parquet(theirs)["prompt"].nunique() == 20
    shared = work / "results" / "shared" / "train" / "training_runs.parquet"
    pd.testing.assert_frame_equal(pd.read_parquet(shared), pd.read_parquet(work / "results" / "smoke" / "train" /
                                                                           "training_runs.parquet"))
    # Shared (cacheable) rules keep no benchmark record under --cache; the figure rules, never cached, keep theirs.
    timed = {p.stem for p in (work / "benchmarks" / "shared").rglob("*.tsv")}
    assert timed == {f"plot_{Path(name).stem}" for name in figures} | {"evaluate_claims", "write_numbers"}, timed
