"""``largeprompt publish RUN``: a finished run's figures, small tables and measured stage times in a folder of the docs
(docs/paper-run/ for config/paper.yaml; README.md, "Runs and configurations").

* ``figures/``: every PNG of figures/<run>/, palette-quantised (and if need be downscaled) to at most ``MAX_PNG_BYTES``;
* ``tables/``: every result table of results/<run>/ under ``MAX_TABLE_BYTES``, copied byte for byte, so each keeps its
  provenance (config values, seeds, package versions, git commit);
* ``times.md`` and ``times.parquet``: per rule, the jobs' CPU time, wall time and peak RSS from Snakemake's benchmark
  files (benchmarks/<run>/), against ``largeprompt bench --paper --save prediction.json`` when given.
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path

import pandas as pd
from PIL import Image
from pyarrow.parquet import read_schema

from largeprompt.bench.memory import benchmark_records
from largeprompt.bench.report import machine_description
from largeprompt.commands.reading import format_ledger, markdown
from largeprompt.io.parquet_io import read_parquet, read_provenance
from largeprompt.ledger.claims import evaluate
from largeprompt.ledger.representative import seed_against_reference

MAX_PNG_BYTES = 400_000
MAX_TABLE_BYTES = 5_000_000
TRAJECTORY_RULES = ("train", "train_beyond_gaussian")  # R6 per-run trajectories (≈ 3 MB a job at paper scale): their summaries
# are published; the R4 transfer trajectories (under 1 MB a job) are kept, for the trajectory_transfer figure's data


def small_png(source: Path, limit: int = MAX_PNG_BYTES) -> bytes:
    """The PNG ``source`` as it is if under ``limit`` bytes, else quantised to 256 colours and, if still too large,
    downscaled by factors of √2 until it fits."""
    data = source.read_bytes()
    image = Image.open(source).convert("RGB")
    scale = 1.0
    while len(data) > limit:
        size = (round(image.width * scale), round(image.height * scale))
        buffer = io.BytesIO()
        image.resize(size, Image.LANCZOS).quantize(256).save(buffer, format="PNG", optimize=True)
        data, scale = buffer.getvalue(), scale / 2**0.5
    return data


def publish_figures(figures: Path, out: Path) -> list[str]:
    """Copy (shrunk where needed) every PNG of ``figures`` into ``out``; their names."""
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for png in sorted(figures.glob("*.png")):
        (out / png.name).write_bytes(small_png(png))
        names.append(png.name)
    return names


def publish_tables(results: Path, out: Path, limit: int = MAX_TABLE_BYTES) -> list[Path]:
    """Copy every Parquet file under ``results`` smaller than ``limit`` bytes (checkpoints and the per-run
    trajectories of TRAJECTORY_RULES aside) into ``out``, keeping the folder layout; their paths relative to ``out``."""
    copied = []
    for path in sorted(results.rglob("*.parquet")):
        rel = path.relative_to(results)
        if "checkpoints" in rel.parts or path.stat().st_size >= limit \
                or read_provenance(path).get("rule") in TRAJECTORY_RULES:
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, out / rel)
        copied.append(rel)
    return copied


def measured_jobs(benchmarks: Path) -> pd.DataFrame:
    """One row per job from Snakemake's benchmark files (:func:`largeprompt.bench.memory.benchmark_records`): rule,
    job, CPU and wall seconds, peak RSS (MB), and its start and end (the file's modification time is the job's end)."""
    rows = [dict(rule=r["rule"], job="/".join(filter(None, (r["rule"], r["wildcards"]))), cpu_seconds=r["cpu_s"],
                 wall_seconds=r["wall_s"], max_rss_mb=r["peak_rss_mb"], start=r["end"] - r["wall_s"], end=r["end"])
            for r in benchmark_records(benchmarks)]
    return pd.DataFrame(rows)


def stage_times(jobs: pd.DataFrame, prediction: dict | None) -> pd.DataFrame:
    """Per rule: jobs, measured CPU hours, wall hours of its longest job, peak RSS, and the predicted CPU hours."""
    table = jobs.groupby("rule").agg(jobs=("job", "size"), cpu_hours=("cpu_seconds", "sum"), longest_job_hours=("wall_seconds", "max"),
                                     max_rss_mb=("max_rss_mb", "max")).reset_index()
    table["cpu_hours"] /= 3600
    table["longest_job_hours"] /= 3600
    if prediction:
        predicted = pd.DataFrame(prediction["jobs"]).groupby("rule")["seconds"].sum() / 3600
        table["predicted_cpu_hours"] = table["rule"].map(predicted)
        table["measured_over_predicted"] = table["cpu_hours"] / table["predicted_cpu_hours"]
    return table


def busy_seconds(starts, ends) -> float:
    """The length of the union of the intervals [start, end]: the time some job was running (a run made in several
    sittings has idle gaps between its first start and its last end)."""
    total, reach = 0.0, -float("inf")
    for start, end in sorted(zip(starts, ends)):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def times_page(run: str, table: pd.DataFrame, jobs: pd.DataFrame, commits: list[str], prediction: dict | None) -> str:
    """times.md: the commit(s), the machine, the run's wall time and the per-rule table."""
    wall = (jobs["end"].max() - jobs["start"].min()) / 3600
    busy = busy_seconds(jobs["start"], jobs["end"]) / 3600
    lines = [f"# Run `{run}`: measured time of every stage", "",
             f"- commit: {', '.join(f'`{c}`' for c in commits)} (the `git_commit` in the tables' provenance)",
             f"- machine: {machine_description()}", f"- wall time, first job's start to last job's end: {wall:.2f} h, "
             f"of which some job was running {busy:.2f} h; "
             f"CPU time of all {len(jobs)} jobs: {jobs['cpu_seconds'].sum() / 3600:.2f} core-hours"]
    if prediction:
        lines.append(f"- `largeprompt bench --paper` predicted {prediction['total_core_hours']:.2f} core-hours, "
                     f"{prediction['wall_hours']:.2f} h wall on {prediction['cores']} cores ({prediction['machine']})")
    columns = ["rule", "jobs", "cpu_hours", "predicted_cpu_hours", "measured_over_predicted", "longest_job_hours", "max_rss_mb"]
    shown = table[[c for c in columns if c in table]]
    lines += ["", "| " + " | ".join(shown.columns) + " |", "|" + "---|" * len(shown.columns)]
    for row in shown.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def publish_claims(run: str, tables: Path, target: Path, ledger_file: Path | None = None) -> None:
    """claims.md: the ledger of the run (docs/experiments.md#claims): the run's own ``claims/claims.parquet`` where it
    has one (evaluated on every table, published or not), else evaluated on its published tables."""
    def read(name):
        path = tables / name
        return read_parquet(path) if path.is_file() else None
    own = ledger_file is not None and ledger_file.is_file()
    ledger = read_parquet(ledger_file) if own else evaluate(read)
    counts = ", ".join(f"{n} {verdict}" for verdict, n in ledger["verdict"].value_counts().items())
    source = ("the run's ledger (`tables/claims/claims.parquet`, rule `evaluate_claims`, on every table of the run, "
              "published or not)" if own else "`largeprompt.ledger.claims` on the published tables (`tables/`); a claim "
              "whose table is too large to publish is `not run` here")
    target.write_text(f"# Claims of run `{run}`\n\n{len(ledger)} rows: {counts}. From {source}. The rules: "
                      "[docs/experiments.md#claims](../experiments.md#claims).\n\n" + format_ledger(ledger, "markdown") + "\n")


def linear_optimum(folder: Path) -> pd.Series | None:
    """R(Γ*) on the run's test set per (model, L), from ``folder``/training_prompt_lengths.parquet; None where the run
    has no such table or column."""
    path, column = folder / "training_prompt_lengths.parquet", "optimal_linear_attention_test_risk"
    if not path.is_file() or column not in read_schema(path).names:
        return None
    return read_parquet(path, columns=["model", "prompt_length", column]).set_index(["model", "prompt_length"])[column]


def over_linear_optimum(runs: pd.DataFrame, optimum: pd.Series) -> pd.DataFrame:
    """``runs`` with column final_over_optimum: final test MSE over ``optimum`` (:func:`linear_optimum`), a quantity
    that depends much less than the MSE on which test prompts were drawn; NaN for a (model, L) it lacks."""
    keys = pd.MultiIndex.from_frame(runs[["model", "prompt_length"]])
    return runs.assign(final_over_optimum=runs["final_test_loss"].to_numpy() / optimum.reindex(keys).to_numpy())


def publish_single_seed(tables: Path, reference: Path, target: Path, seed: int = 327) -> str:
    """single-seed.md: seed ``seed`` of an earlier single-seed run (``reference``/training_runs.parquet) against the
    other ok seeds of this run, per (model, L) (:mod:`largeprompt.ledger.representative`), by final test MSE over
    each run's own R(Γ*) on its test set when both runs have their training_prompt_lengths table; its summary line."""
    now, then = read_parquet(tables / "train" / "training_runs.parquet"), read_parquet(reference / "training_runs.parquet")
    optimum_now, optimum_then = linear_optimum(tables / "train"), linear_optimum(reference)
    scaled = optimum_now is not None and optimum_then is not None
    if scaled:
        now, then = over_linear_optimum(now, optimum_now), over_linear_optimum(then, optimum_then)
    value = "final_over_optimum" if scaled else "final_test_loss"
    table = seed_against_reference(now, then, seed, value)
    inside = int(table["reference_within"].sum())
    summary = (f"seed {seed} of the single-seed run lies within the other seeds' 95% prediction interval at {inside} of "
               f"{len(table)} (model, L)")
    shown = table.drop(columns=["status_now", "status_reference"]).assign(
        status=table["status_now"].astype(str) + " / " + table["status_reference"].astype(str))
    what = ("final test MSE over R(Γ*) on that run's test set (the two runs drew different test prompts)" if scaled
            else "final test MSE")
    lines = [f"# Seed {seed}: the single-seed run against this run's other seeds", "",
             f"{summary}, by {what}. Seed {seed} then (`seed_reference`, from `{reference}`) and now "
             f"(`seed_now`, same init, other batches), against the 95% prediction interval of one more seed from this "
             "run's other ok seeds (`pi_low`, `pi_high`); `difference_in_sd`: now − then in units of their spread. "
             "The rule: [docs/experiments.md#paper-seeds](../experiments.md#paper-seeds).", "", markdown(shown)]
    target.write_text("\n".join(lines) + "\n")
    return summary


def publish(run: str, out: Path, prediction_file: Path | None = None, root: Path = Path("."),
            reference: Path | None = None) -> str:
    """Publish run ``run`` of the checkout at ``root`` into ``out``; a one-line summary."""
    prediction = json.loads(prediction_file.read_text()) if prediction_file else None
    figures = publish_figures(root / "figures" / run, out / "figures")
    tables = publish_tables(root / "results" / run, out / "tables")
    commits = sorted({read_provenance(out / "tables" / rel).get("git_commit", "unknown") for rel in tables})
    jobs = measured_jobs(root / "benchmarks" / run)
    table = stage_times(jobs, prediction)
    table.to_parquet(out / "times.parquet", index=False)
    (out / "times.md").write_text(times_page(run, table, jobs, commits, prediction))
    publish_claims(run, out / "tables", out / "claims.md", root / "results" / run / "claims" / "claims.parquet")
    done = f"published {len(figures)} figures, {len(tables)} tables and the times of {len(jobs)} jobs into {out}"
    if reference is not None:
        done += "; " + publish_single_seed(out / "tables", reference, out / "single-seed.md")
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="largeprompt publish", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="the run name (config key `run`), e.g. paper")
    parser.add_argument("--out", type=Path, required=True, help="folder to write, e.g. docs/paper-run")
    parser.add_argument("--prediction", type=Path, help="the JSON of `largeprompt bench --paper --save`")
    parser.add_argument("--reference", type=Path, help="a folder with an earlier single-seed run's training_runs.parquet "
                        "(e.g. docs/paper-run/single-seed): its seed 327 against this run's other seeds")
    args = parser.parse_args(argv)
    print(publish(args.run, args.out, args.prediction, reference=args.reference))
    return 0
