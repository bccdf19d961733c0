"""Peak memory of every Snakemake job, and the ``mem_mb`` it should declare (``largeprompt bench --memory``).

The pipeline runs from empty in a fresh copy; every rule has a ``benchmark:`` file, in which Snakemake itself
records each job's wall time, CPU time and peak RSS (benchmarks/<run>/<rule>[/<wildcards>].tsv).
"""
from __future__ import annotations

import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from largeprompt.bench.costs import prepared, timed, with_values
from largeprompt.bench.pipeline import REPO, checkout_env, fresh_copy, paper_config
from largeprompt.bench.report import run_worker
from largeprompt.maths.concentration import prompt_length_grid

MARGIN, STEP_MB, MIN_MB = 1.5, 100, 500
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


def benchmark_records(folder: Path) -> list[dict]:
    """One record per job of Snakemake's benchmark files under ``folder`` (benchmarks/<run>/): rule, wildcards (the
    file's path below the rule), wall seconds, CPU seconds, peak RSS in MB and the job's end (the file's mtime)."""
    records = []
    for path in sorted(Path(folder).rglob("*.tsv")):
        rel = path.relative_to(folder).with_suffix("")
        rule, wildcards = rel.parts[0], "/".join(rel.parts[1:])
        row = pd.read_csv(path, sep="\t").iloc[-1]
        records.append({"rule": rule, "wildcards": wildcards, "wall_s": float(row["s"]), "cpu_s": float(row["cpu_time"]),
                        "peak_rss_mb": float(row["max_rss"]), "end": path.stat().st_mtime})
    return records


def profile_pipeline(configfile: str | None, cores: int = 1) -> tuple[dict[str, dict], str]:
    """Run the pipeline from empty in a fresh copy: :func:`peaks_by_rule` of its jobs' benchmark files, and the end
    of Snakemake's stderr if a job failed (the others still run: --keep-going)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = fresh_copy(REPO, Path(tmp) / "repo")
        args = ["--cores", str(cores), "--keep-going"] + (["--configfile", configfile] if configfile else [])
        proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=work, env=checkout_env(work),
                              capture_output=True, text=True)
        runs = [p for p in (work / "benchmarks").iterdir()] if (work / "benchmarks").is_dir() else []
        records = [r for folder in runs for r in benchmark_records(folder)]
        failed = proc.stderr[-3000:] if proc.returncode != 0 else ""
        return peaks_by_rule(records), failed


def bench_memory(configfile: str | None, cores: int = 1) -> list[str]:
    """One line per rule: its largest measured peak RSS and the mem_mb that covers it with the margin."""
    peaks, failed = profile_pipeline(configfile, cores)
    label = configfile or "config/config.yaml (default)"
    out = [f"# peak RSS of every job (Snakemake's benchmark files), {label}; mem_mb = peak x {MARGIN} rounded up to "
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
                timed("plot_affine_limit", config, folder / "p", {"bands": str(folder / "a" / "bands.parquet")})))
    cells = [[m, float(c)] for m in b["token_measures"] for c in b["c_values"]]
    jobs = prepared("errors", folder / "errors", cells=cells, lengths=lengths, n_repetitions=b["n_repetitions"])
    rows = len(cells) * len(lengths) * b["n_repetitions"]
    collected = timed("collect_concentration_errors", config, folder / "c", jobs)
    out.append((f"collect_concentration_errors ({rows / 1e6:.1f}M synthetic rows)", collected))
    tables = {k: str(folder / "c" / f"{k}.parquet") for k in ("output_errors", "gradient_errors")}
    estimated = timed("estimate_concentration_rates", config, folder / "r", tables)
    out.append((f"estimate_concentration_rates ({rows / 1e6:.1f}M rows)", estimated))
    longest = max(config["train"]["prompt_lengths"] + config["trajectory_transfer"]["prompt_lengths"])
    cfg = with_values(config, max_prompt_length=longest, prompt_length=longest)
    out.append((f"make_icl_test_set (n_test {config['icl']['n_test']}, L {longest})",
                timed("make_icl_test_set", cfg, folder / "t")))
    test_set = {"test_set": str(folder / "t" / "test_set.parquet")}
    out.append(("bayes_risk", timed("bayes_risk", cfg, folder / "b", test_set)))
    out.append((f"train/train_trajectory_transfer: reading the test set at L {longest}",
                timed("load_test_set", cfg, folder / "l", test_set)))
    for key, rule, dtype in (("train", "train", config["train"]["dtype"]), ("trajectory_transfer", "train_trajectory_transfer", "float64")):
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
    cfg = with_values(config, token_measure=b["token_measures"][0], c=1.0, concentration__log2_max_prompt_length=SHORT_PROMPT_LOG2,
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
