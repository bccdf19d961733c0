"""Peak memory of every Snakemake job, and the ``mem_mb`` it should declare (``largeprompt bench --memory``).

The pipeline runs in a fresh copy with a ``sitecustomize`` hook on PYTHONPATH: every job's Python process
appends its rule, wildcards and peak RSS (getrusage ru_maxrss, the kernel's high-water mark) to a log at exit.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from largeprompt.bench.costs import prepared, timed, with_values
from largeprompt.bench.pipeline import REPO, checkout_env, fresh_copy, paper_config
from largeprompt.bench.report import run_worker
from largeprompt.maths.concentration import prompt_length_grid

MARGIN, STEP_MB, MIN_MB = 1.5, 100, 500
HOOK = '''import atexit, json, os, resource, sys


def _peak_rss():
    smk = getattr(sys.modules.get("__main__"), "snakemake", None)
    if smk is None:  # Snakemake itself, or any other Python process
        return
    with open(os.environ["LARGEPROMPT_RSS_LOG"], "a") as fh:
        fh.write(json.dumps({"rule": smk.rule, "wildcards": dict(smk.wildcards.items()),
                             "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}) + "\\n")


if os.environ.get("LARGEPROMPT_RSS_LOG"):
    atexit.register(_peak_rss)
'''


def mem_mb(peak_mb: float, margin: float = MARGIN, step: int = STEP_MB, floor: int = MIN_MB) -> int:
    """The ``mem_mb`` to declare for a measured peak: peak × margin, rounded up to ``step`` MB, at least ``floor``."""
    if not math.isfinite(peak_mb) or peak_mb < 0:
        raise ValueError(f"peak RSS must be a non-negative number of MB, got {peak_mb!r}")
    return max(floor, step * math.ceil(peak_mb * margin / step))


def peaks_by_rule(records: list[dict]) -> dict[str, dict]:
    """rule → {"peak_rss_mb": largest peak over its jobs, "jobs": count, "worst": wildcards of that job}."""
    out: dict[str, dict] = {}
    for rec in records:
        best = out.setdefault(rec["rule"], {"peak_rss_mb": -1.0, "jobs": 0, "worst": {}})
        best["jobs"] += 1
        if rec["peak_rss_mb"] > best["peak_rss_mb"]:
            best.update(peak_rss_mb=rec["peak_rss_mb"], worst=rec["wildcards"])
    return out


def profile_pipeline(configfile: str | None, cores: int = 1) -> tuple[dict[str, dict], str]:
    """Run the pipeline from empty in a fresh copy: :func:`peaks_by_rule` of its jobs, and the end of Snakemake's
    stderr if a job failed (the others still run: --keep-going)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = fresh_copy(REPO, Path(tmp) / "repo")
        hook = Path(tmp) / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
        log = Path(tmp) / "peak_rss.jsonl"
        env = dict(checkout_env(work, hook), LARGEPROMPT_RSS_LOG=str(log))
        args = ["--cores", str(cores), "--keep-going"] + (["--configfile", configfile] if configfile else [])
        proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=work, env=env, capture_output=True,
                              text=True)
        rows = log.read_text().splitlines() if log.exists() else []
        failed = proc.stderr[-3000:] if proc.returncode != 0 else ""
        return peaks_by_rule([json.loads(row) for row in rows if row.strip()]), failed


def bench_memory(configfile: str | None, cores: int = 1) -> list[str]:
    """One line per rule: its largest measured peak RSS and the mem_mb that covers it with the margin."""
    peaks, failed = profile_pipeline(configfile, cores)
    label = configfile or "config/config.yaml (default)"
    out = [f"# peak RSS of every job (ru_maxrss at exit), {label}; mem_mb = peak x {MARGIN} rounded up to "
           f"{STEP_MB} MB, at least {MIN_MB}",
           f"{'rule':<32} {'jobs':>5} {'peak RSS (MB)':>14} {'mem_mb':>8}  largest job"]
    for rule in sorted(peaks):
        p = peaks[rule]
        out.append(f"{rule:<32} {p['jobs']:>5} {p['peak_rss_mb']:>14.0f} {mem_mb(p['peak_rss_mb']):>8}  {p['worst']}")
    if failed:
        out.append("  SOME JOBS FAILED (the rules above are those that finished); Snakemake said:\n" + failed)
    return out


def _paper_runs(config: dict, folder: Path) -> list[tuple[str, dict]]:
    """(label, {"cpu", "rss_mb"}) of the stages whose memory grows with the paper's tables, run at full paper size."""

    b, out = config["concentration"], []
    lengths = prompt_length_grid(b["log2_min_prompt_length"], b["log2_max_prompt_length"], b["points_per_octave"])
    out.append(_simulate_errors_table(config, folder / "s", len(lengths)))
    out.append((f"simulate_affine_limit (n_prompts {config['affine_limit']['n_prompts']})",
                timed("simulate_affine_limit", config, folder / "a", prepared("queries", folder / "q", params=config))))
    out.append(("plot_affine_limit (its table)",
                timed("plot_affine_limit", config, folder / "p", {"outputs": str(folder / "a" / "outputs.parquet")})))
    cells = [[m, float(c)] for m in b["measures"] for c in b["c_values"]]
    jobs = prepared("errors", folder / "errors", cells=cells, lengths=lengths, n_repetitions=b["n_repetitions"])
    rows = len(cells) * len(lengths) * b["n_repetitions"]
    collected = timed("collect_concentration_errors", config, folder / "c", jobs)
    out.append((f"collect_concentration_errors ({rows / 1e6:.1f}M synthetic rows)", collected))
    tables = {k: str(folder / "c" / f"{k}.parquet") for k in ("output_errors", "gradient_errors")}
    estimated = timed("estimate_concentration_rates", config, folder / "r", tables)
    out.append((f"estimate_concentration_rates ({rows / 1e6:.1f}M rows)", estimated))
    longest = max(config["train"]["prompt_lengths"] + config["transfer"]["prompt_lengths"])
    cfg = with_values(config, max_prompt_length=longest, prompt_length=longest)
    out.append((f"make_icl_test_set (n_test {config['icl']['n_test']}, L {longest})",
                timed("make_icl_test_set", cfg, folder / "t")))
    test_set = {"test_set": str(folder / "t" / "test_set.parquet")}
    out.append(("bayes_risk", timed("bayes_risk", cfg, folder / "b", test_set)))
    out.append((f"train/train_transfer: reading the test set at L {longest}",
                timed("load_test_set", cfg, folder / "l", test_set)))
    for key, rule, dtype in (("train", "train", config["train"]["dtype"]), ("transfer", "train_transfer", "float64")):
        section = config[key]
        L = max(section["prompt_lengths"])
        out.append((f"{rule} at L {L}, cut to 2 steps ({section['batch_size']} prompts a batch)",
                    run_worker("train_memory", section=section, icl=config["icl"], dtype=dtype, train_length=L,
                               test_set=test_set["test_set"])))
    return out


SHORT_PROMPT_LOG2 = 13  # simulate_concentration_errors at the paper's table size on prompts of 2^13 tokens (one streamed chunk)


def _simulate_errors_table(config: dict, folder: Path, n_lengths: int) -> tuple[str, dict]:
    """simulate_concentration_errors with the paper's repetitions, block and chunk, its L grid as many points as the paper's
    (a denser grid to 2^13): the result table of the paper's size, at 1/128 of the streaming (measured
    separately at paper size by the slices of ``--paper``)."""

    b, ppo = config["concentration"], config["concentration"]["points_per_octave"]
    grid = lambda ppo: prompt_length_grid(b["log2_min_prompt_length"], SHORT_PROMPT_LOG2, ppo)  # noqa: E731
    while len(grid(ppo)) < n_lengths:
        ppo += 1
    cfg = with_values(config, measure=b["measures"][0], c=1.0, concentration__log2_max_prompt_length=SHORT_PROMPT_LOG2,
                      concentration__points_per_octave=ppo)
    rows = b["n_repetitions"] * len(grid(ppo))
    return f"simulate_concentration_errors ({rows / 1e6:.2f}M rows, L to 2^{SHORT_PROMPT_LOG2})", timed("simulate_concentration_errors", cfg, folder)


def bench_paper_memory() -> list[str]:
    """Peak RSS of simulate_concentration_errors (the paper's table size), simulate_affine_limit,
    collect_concentration_errors, estimate_concentration_rates (synthetic error tables of the paper's size), the
    test set's stages, a training job's reading of it and training jobs cut to 2 steps, each at full config/paper.yaml size in its own process."""

    with tempfile.TemporaryDirectory() as tmp:
        runs = _paper_runs(paper_config(), Path(tmp))
    out = ["# config/paper.yaml, full size, one process per stage: peak RSS (VmHWM, imports included) and CPU time",
           f"{'stage':<58} {'CPU (s)':>9} {'peak RSS (MB)':>14} {'mem_mb':>8}"]
    out += [f"{label:<58} {r['cpu']:>9.1f} {r['rss_mb']:>14.0f} {mem_mb(r['rss_mb']):>8}" for label, r in runs]
    return out
