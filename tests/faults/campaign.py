"""Fault-injection campaign of the pipeline (docs/reliability.md): injects real faults (SIGKILL, SIGINT, a corrupt
checkpoint, a full disk, concurrent invocations, SLURM failures) into a throwaway copy of the repository whose smoke
run is the reference, and checks after each that no result file ever looked complete while it was not, that the
documented recovery rebuilds every file bit-identically, and what the user was told.

    .venv/bin/python tests/faults/campaign.py [--trials K] [--only FAULT,...] [--write-docs] [--seed S]

K (default 20) trials of each kill point; the other faults run min(K, their own cap) trials. --only takes fault
keys or the groups ``kill``, ``local`` and ``slurm`` (``--list`` shows them). --write-docs rewrites the table of
docs/reliability.md (run with the default trial counts). Exit status 0 when every fault that ran survived every trial.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parent):  # the campaign's modules, then tests/helpers.py
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import fault_local as local  # noqa: E402
import fault_slurm as slurm  # noqa: E402
from fault_report import Fault, FaultResult, table, write_docs  # noqa: E402
from fault_workspace import PLAIN, Workspace, user_message  # noqa: E402

from helpers import REPO  # noqa: E402

DOC = REPO / "docs" / "reliability.md"


@dataclass
class Context:
    """What the trials share: the workspace, the wall time of a forced training run, the SLURM cluster."""

    ws: Workspace
    forced_train_seconds: float = 0.0
    spans: dict = field(default_factory=dict)  # rule -> wall time of its jobs in a forced run (kill points)
    cluster: slurm.Cluster | None = None


def _kill_fault(rule: str) -> Fault:
    def trial(ctx, rng, i):
        result, redraws = local.kill_job_trial(ctx.ws, rule, rng, ctx.spans)
        if redraws:
            result.notes.append(f"{redraws} earlier draw(s) fell after the jobs had ended")
        return result

    return Fault(f"kill_{rule}", f"SIGKILL of the `{rule}` job at a random moment", None, trial, "kill")


FAULTS = [
    *(_kill_fault(rule) for rule in local.KILL_RULES),
    Fault("kill_snakemake", "SIGKILL of Snakemake's process group during `--forcerun train`", 10,
          lambda ctx, rng, i: local.snakemake_kill_trial(ctx.ws, rng, ctx.forced_train_seconds)),
    Fault("sigint_forcerun", "SIGINT 1-8 s into `snakemake --forcerun train`", 10, lambda ctx, rng, i: local.sigint_trial(ctx.ws, rng, i)),
    Fault("corrupt_checkpoint", "corrupt training checkpoint (truncated / one byte flipped)", 6,
          lambda ctx, rng, i: local.corrupt_checkpoint_trial(ctx.ws, ("truncate", "flip")[i % 2])),
    Fault("disk_full", "full disk (tmpfs) under `simulate_concentration_errors`' output", 3, lambda ctx, rng, i: local.disk_full_trial(ctx.ws)),
    Fault("concurrent_same_run", "the same forced run started twice at once", 3, lambda ctx, rng, i: local.concurrent_same_trial(ctx.ws)),
    Fault("concurrent_two_runs", "two runs (`smoke`, `faults_b`) in one checkout at once", 2,
          lambda ctx, rng, i: local.concurrent_runs_trial(ctx.ws)),
    *slurm.FAULTS,
]
GROUPS = {"kill": {f.key for f in FAULTS if f.group == "kill"}, "slurm": {f.key for f in FAULTS if f.group == "slurm"},
          "local": {f.key for f in FAULTS if f.group != "slurm"}}


def select(only: str | None) -> list[Fault]:
    if not only:
        return list(FAULTS)
    wanted = set()
    for name in only.split(","):
        keys = GROUPS.get(name.strip(), {name.strip()})
        unknown = keys - {f.key for f in FAULTS}
        if unknown:
            raise SystemExit(f"unknown fault {sorted(unknown)}; known: {[f.key for f in FAULTS]} and groups {sorted(GROUPS)}")
        wanted |= keys
    return [f for f in FAULTS if f.key in wanted]


def prepare(base: Path, faults: list[Fault], say) -> Context:
    """The workspace and its reference: the smoke run built uninterrupted, its Parquet hashes and job times."""
    ws = Workspace.create(base)
    start = time.monotonic()
    rc, out = ws.run(*PLAIN, tag="reference")
    if rc != 0:
        raise RuntimeError(f"the reference smoke run failed: {user_message(out)}\n{out[-3000:]}")
    ws.record_reference()
    say(f"reference: {len(ws.reference)} Parquet files in {time.monotonic() - start:.0f} s ({ws.root})")
    ctx = Context(ws)
    if any(f.key == "kill_snakemake" for f in faults):
        start = time.monotonic()
        rc, out = ws.run("--forcerun", "train", *PLAIN, tag="forced-train")
        ctx.forced_train_seconds = time.monotonic() - start
        if rc != 0 or ws.lost():
            raise RuntimeError(f"an uninterrupted forced rerun is not bit-identical: {ws.lost()} {user_message(out)}")
        say(f"forced training run: {ctx.forced_train_seconds:.0f} s, bit-identical")
    return ctx


def run_fault(ctx: Context, fault: Fault, n: int, rng: np.random.Generator, say) -> FaultResult:
    result = FaultResult(fault.key, fault.title)
    start = time.monotonic()
    for i in range(n):
        outcome = fault.trial(ctx, rng, i)
        if isinstance(outcome, str):
            result.skipped = outcome
            break
        result.trials.append(outcome)
        state = "survived" if outcome.survived else "FAILED: " + "; ".join(outcome.problems)
        say(f"  {fault.key} {i + 1}/{n}: {state}; lost {outcome.lost}; {'; '.join(outcome.notes)}")
    result.seconds = time.monotonic() - start
    if fault.key == "kill_train" and result.trials:
        resumed = sum("resumed from a checkpoint" in t.notes for t in result.trials)
        result.notes.append(f"{resumed} of {len(result.trials)} reruns resumed from a checkpoint")
    return result


def run_faults(ctx: Context, faults: list[Fault], trials: int, seed: int, say=print, slurm_trials: int | None = None) -> list[FaultResult]:
    """Run ``faults`` in the prepared context: K = ``trials`` per kill point, min(K, cap) for the others (for the
    SLURM faults min(``slurm_trials``, cap) when given); the SLURM cluster is started at the first SLURM fault."""
    results = []
    for fault in faults:
        k = slurm_trials if fault.group == "slurm" and slurm_trials is not None else trials
        n = k if fault.cap is None else min(k, fault.cap)
        rng = np.random.default_rng([seed, FAULTS.index(fault)])
        if fault.group == "slurm" and ctx.cluster is None:
            ctx.cluster = slurm.Cluster.start(ctx.ws, say)
        results.append(run_fault(ctx, fault, n, rng, say))
        say(results[-1].line())
    return results


def close(ctx: Context | None, say=print) -> None:
    """Stop every Snakemake the campaign started that still runs, and the SLURM cluster if the campaign started it."""
    if ctx is None:
        return
    ctx.ws.stop_all()
    if ctx.cluster is not None:
        if ctx.cluster.ws is not None:
            ctx.cluster.ws.stop_all()
        ctx.cluster.stop(say)


def run_campaign(trials: int = 20, only: str | None = None, base: Path | None = None, seed: int | None = None,
                 say=print, keep: bool = False, slurm_trials: int | None = None) -> tuple[list[FaultResult], int, float]:
    """Run the selected faults in a new workspace under ``base``; (one result per fault, the seed, seconds taken)."""
    seed = int(np.random.SeedSequence().entropy % 2**32) if seed is None else seed
    faults = select(only)
    say(f"fault-injection campaign: seed {seed}, {trials} trials per kill point, faults {[f.key for f in faults]}")
    base = Path(base) if base else Path(tempfile.mkdtemp(prefix="largeprompt-faults-"))
    start, ctx, results = time.monotonic(), None, []
    try:
        ctx = prepare(base, faults, say)
        results = run_faults(ctx, faults, trials, seed, say, slurm_trials)
    finally:
        close(ctx, say)
        if keep:
            (base / "campaign.json").write_text(json.dumps([dict(vars(r), trials=[vars(t) for t in r.trials]) for r in results],
                                                           indent=1, default=str))
        else:
            shutil.rmtree(base, ignore_errors=True)
    return results, seed, time.monotonic() - start


def header(results: list[FaultResult], seed: int, seconds: float, trials: int) -> str:
    counts = ", ".join(f"{r.key} {len(r.trials)}" for r in results if not r.skipped)
    return (f"Campaign of {datetime.date.today().isoformat()}: `tests/faults/campaign.py --trials {trials} --seed {seed}` "
            f"(seed {seed}), {seconds / 60:.0f} min on a 2-core machine shared with other work. Trials per fault: {counts}.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="trials per kill point (others: min(K, their cap))")
    parser.add_argument("--slurm-trials", type=int, help="trials per SLURM fault (default: min(K, 3))")
    parser.add_argument("--only", help="comma-separated fault keys or groups (kill, local, slurm)")
    parser.add_argument("--seed", type=int, help="seed of the kill moments (default: fresh, printed)")
    parser.add_argument("--write-docs", action="store_true", help=f"rewrite the table in {DOC.relative_to(REPO)}")
    parser.add_argument("--workdir", type=Path, help="where the throwaway copy goes (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir (the copy and every Snakemake log)")
    parser.add_argument("--list", action="store_true", help="list the faults and exit")
    args = parser.parse_args(argv)
    if args.list:
        for f in FAULTS:
            print(f"{f.key:32} {f.group:6} {f.title}")
        return 0
    say = lambda text: print(text, flush=True)  # noqa: E731
    results, seed, seconds = run_campaign(args.trials, args.only, args.workdir, args.seed, say, args.keep, args.slurm_trials)
    text = table(results, header(results, seed, seconds, args.trials))
    say("\n" + text)
    if args.write_docs:
        write_docs(DOC, text)
        say(f"table written to {DOC}")
    return 0 if all(r.ok or r.skipped for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
