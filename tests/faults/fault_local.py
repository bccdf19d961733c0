"""The campaign's faults on one machine (docs/reliability.md): SIGKILL of a job at a random moment, SIGKILL of
Snakemake's whole process group, SIGINT during a forced rerun, a corrupt training checkpoint, a full disk, and
two Snakemake invocations at once. Each trial runs in the campaign's workspace (fault_workspace.Workspace), whose
smoke run is the reference; every trial ends with the documented recovery and counts the reference files lost.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
from fault_procs import group_members, job_pids, kill, kill_group, wait_until
from fault_report import Trial
from fault_workspace import PLAIN, RUN, SnakemakeRun, Workspace, brief, user_message

from helpers import SMOKE

# The rules whose job is killed, and the targets of the forced run that starts it.
KILL_RULES = {
    "train": ("--until", "train"),
    "simulate_concentration_errors": ("--until", "simulate_concentration_errors"),
    "collect_concentration_errors": ("--until", "collect_concentration_errors"),
    "estimate_concentration_rates": ("--until", "estimate_concentration_rates"),
    "plot_rate_exponent": (f"figures/{RUN}/rate_exponent.pdf",),
}
LOCKED = "Directory cannot be locked"


def recover(ws: Workspace, trial: Trial, tag: str, since: float | None = None) -> str:
    """The documented recovery: the plain command (after ``snakemake --unlock`` if Snakemake asks for it); then the
    reference files lost are counted and stale temporary files noted (and removed, so trials stay independent)."""
    rc, out = ws.run(*PLAIN, tag=f"{tag}-rerun")
    if rc != 0 and LOCKED in out:
        trial.notes.append("stale lock: the plain rerun asked for `snakemake --unlock`")
        ws.unlock()
        rc, out = ws.run(*PLAIN, tag=f"{tag}-rerun-unlocked")
    if rc != 0:
        trial.problems.append(f"plain rerun failed: {user_message(out) or brief(out.strip().splitlines()[-1])}")
    lost = ws.lost()
    trial.lost = len(lost)
    if lost:
        trial.problems.append("lost after the rerun: " + ", ".join(lost))
    temps = ws.clear_stale_temps()
    if temps:
        trial.notes.append(f"{temps} stale .tmp file(s) left under results/ by the interrupted write")
    trial.survived = not trial.problems
    return out


def _check_failure(trial: Trial, rc: int, out: str, bad: set[str], rule: str | None) -> None:
    """A run with an injected job failure must fail, say so with 'Error in rule', and never show a partial file."""
    trial.message = user_message(out, rule)
    if rc == 0:
        trial.problems.append("Snakemake exited 0 although its job was killed")
    if not re.search("^Error in rule " + (rule or r"\w+") + ":", out, flags=re.M):
        trial.problems.append("no 'Error in rule' line")
    if bad:
        trial.problems.append("partial or different Parquet seen: " + ", ".join(sorted(bad)))


def _kill_job_at(ws: Workspace, run: SnakemakeRun, script: str, at: float) -> tuple[int | None, float]:
    """Wait for the first job process of ``script``, then SIGKILL the one running ``at`` s later: (its pid, seconds
    since the first job started); (None, seconds until the last job ended) when every job had ended by then."""
    if not wait_until(lambda: job_pids(ws.root, script), 600, give_up=lambda: not run.running()):
        return None, 0.0
    t0, last = time.monotonic(), 0.0
    while run.running():
        pids, now = job_pids(ws.root, script), time.monotonic() - t0
        if pids:
            last = now
            if now >= at and kill(pids[0]):
                return pids[0], now
        time.sleep(0.01)
    return None, last


def measure_span(ws: Workspace, rule: str) -> float:
    """Wall time of the rule's jobs in an uninterrupted forced run (first job start to last job end); the run must
    leave every file bit-identical."""
    run = ws.start(*KILL_RULES[rule], "--forcerun", rule, "--cores", "1", "--configfile", SMOKE, tag=f"span-{rule}")
    _, span = _kill_job_at(ws, run, rule, float("inf"))
    if run.wait() != 0 or ws.lost() or span <= 0:
        raise RuntimeError(f"a forced run of {rule} failed or changed a file: {ws.lost()} {user_message(run.output())}")
    return span


def kill_job_trial(ws: Workspace, rule: str, rng: np.random.Generator, spans: dict, max_draws: int = 4) -> tuple[Trial, int]:
    """SIGKILL a job of ``rule`` at a moment uniform over the wall time of its jobs (``spans[rule]``, measured by
    :func:`measure_span`, updated when a draw falls after the jobs ended); (trial, redraws)."""
    if rule not in spans:
        spans[rule] = measure_span(ws, rule)
    for draw in range(max_draws):
        at = float(rng.uniform(0, spans[rule]))
        started = time.time()
        run = ws.start(*KILL_RULES[rule], "--forcerun", rule, "--cores", "1", "--configfile", SMOKE, tag=f"kill-{rule}")
        pid, when = _kill_job_at(ws, run, rule, at)
        bad = ws.watch(run)
        trial = Trial(survived=False)
        if pid is None:  # the jobs had all ended: a finished forced run, which must be intact
            if run.proc.returncode != 0 or bad or ws.lost():
                trial.problems.append(f"forced run without a kill failed: {user_message(run.output())}")
                recover(ws, trial, f"kill-{rule}")
                return trial, draw
            spans[rule] = when or spans[rule]
            continue
        _check_failure(trial, run.proc.returncode, run.output(), bad, rule)
        trial.notes.append(f"killed at {when:.1f} s of {spans[rule]:.1f} s")
        recover(ws, trial, f"kill-{rule}")
        if rule == "train" and _resumed(ws, started):
            trial.notes.append("resumed from a checkpoint")
        return trial, draw
    return Trial(survived=False, problems=[f"no kill landed inside the job in {max_draws} draws"]), max_draws


def _resumed(ws: Workspace, since: float) -> bool:
    logs = [p for p in (ws.root / "logs" / RUN / "train").glob("L*.log") if p.stat().st_mtime >= since]
    return any("resumed" in p.read_text(errors="replace") for p in logs)


def snakemake_kill_trial(ws: Workspace, rng: np.random.Generator, span: float) -> Trial:
    """SIGKILL Snakemake's whole process group at a moment uniform over a forced training run."""
    at = float(rng.uniform(0, span))
    run = ws.start("--forcerun", "train", *PLAIN, tag="kill-snakemake")
    deadline = time.monotonic() + at
    while time.monotonic() < deadline and run.running():
        time.sleep(0.01)
    trial = Trial(survived=False, notes=[f"killed at {at:.1f} s of {span:.0f} s"])
    if not run.running():
        trial.notes.append("the run had ended before the kill")
    kill_group(run.pid, signal.SIGKILL)
    run.wait(60)
    bad = set(ws.audit())
    left = wait_until(lambda: not group_members(run.pid), 30) is None and group_members(run.pid)
    if left:
        trial.problems.append(f"processes of the killed group still running: {left}")
    if bad:
        trial.problems.append("partial or different Parquet seen: " + ", ".join(sorted(bad)))
    out = recover(ws, trial, "kill-snakemake")
    locked = any("unlock" in n for n in trial.notes)
    trial.message = "(Snakemake killed, nothing printed); " + (
        "the plain rerun: `Error: Directory cannot be locked. … run snakemake --unlock`" if locked else
        "the plain rerun: " + (_rebuilt(out) or "nothing to do"))
    return trial


def _rebuilt(out: str) -> str:
    """'rebuilt N jobs (reason …)' from a rerun's output."""
    jobs = re.findall(r"^(?:local)?rule (\w+):", out, flags=re.M)
    reasons = {brief(r.split(":")[0]) for r in re.findall(r"^\s*reason: (.*)$", out, flags=re.M)}
    return f"rebuilt {len(jobs)} jobs ({'; '.join(sorted(reasons))})" if jobs else ""


def sigint_trial(ws: Workspace, rng: np.random.Generator, index: int) -> Trial:
    """SIGINT 1-8 s into ``snakemake --forcerun train``: to the process group (Ctrl-C in a terminal) on even trials,
    to Snakemake alone (``kill -INT``) on odd ones; then the plain rerun must restore every file."""
    at = float(rng.uniform(1, 8))
    to_group = index % 2 == 0
    run = ws.start("--forcerun", "train", *PLAIN, tag="sigint")
    time.sleep(at)
    trial = Trial(survived=False, notes=[f"SIGINT at {at:.1f} s to {'the process group' if to_group else 'Snakemake'}"])
    (kill_group if to_group else kill)(run.pid, signal.SIGINT)
    deadline = time.monotonic() + 120
    bad: set[str] = set()
    while run.running() and time.monotonic() < deadline:
        bad.update(ws.audit())
        time.sleep(0.05)
    if run.running():
        trial.problems.append("Snakemake still running 120 s after SIGINT (killed)")
        kill_group(run.pid)
    run.wait(60)
    bad.update(ws.audit())
    if bad:
        trial.problems.append("partial or different Parquet seen: " + ", ".join(sorted(bad)))
    out = run.output()
    trial.message = user_message(out) or brief(out.strip().splitlines()[-1])
    recover(ws, trial, "sigint")
    return trial


def _checkpoints(ws: Workspace) -> list[Path]:
    folder = ws.root / "results" / RUN / "checkpoints" / "train"
    try:
        return [folder / n for n in sorted(os.listdir(folder)) if n.endswith(".pt")]
    except FileNotFoundError:
        return []


def _stop_after_checkpoint(ws: Workspace, run: SnakemakeRun) -> Path | None:
    """SIGKILL the running train job as soon as its checkpoint file exists; that checkpoint, or None when the job
    completed (and removed its checkpoint) before the kill."""
    while run.running():
        found = _checkpoints(ws)
        if found:
            for pid in job_pids(ws.root, "train"):
                kill(pid)
            run.wait(120)
            return found[0] if found[0].exists() else None
        time.sleep(0.002)
    return None


def _corrupt(path: Path, mode: str) -> str:
    data = bytearray(path.read_bytes())
    if mode == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
        return f"truncated to {len(data) // 2} of {len(data)} bytes"
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return f"byte {len(data) // 2} of {len(data)} flipped"


def corrupt_checkpoint_trial(ws: Workspace, mode: str, max_tries: int = 5) -> Trial:
    """Stop a train job right after it wrote a checkpoint, corrupt the checkpoint (``mode``: truncate | flip), rerun
    plainly: the job log must report the corrupt checkpoint, training restart from step 0, the result be identical."""
    for stale in _checkpoints(ws):
        stale.unlink()
    for _ in range(max_tries):
        run = ws.start("--until", "train", "--forcerun", "train", "--cores", "1", "--configfile", SMOKE, tag="checkpoint")
        checkpoint = _stop_after_checkpoint(ws, run)
        run.wait(120)
        if checkpoint is not None:
            break
    else:
        return Trial(survived=False, problems=[f"no train job was caught holding a checkpoint in {max_tries} tries"])
    trial = Trial(survived=False, notes=[_corrupt(checkpoint, mode)])
    started = time.time()
    recover(ws, trial, "checkpoint")
    log = ws.root / "logs" / RUN / "train" / f"{checkpoint.stem}.log"
    text = log.read_text(errors="replace") if log.exists() and log.stat().st_mtime >= started else ""
    line = next((ln for ln in text.splitlines() if "checkpoint" in ln and "corrupt" in ln), "")
    if not line or "step 0" not in line:
        trial.problems.append(f"{log.name} does not report the corrupt checkpoint and a restart from step 0")
    if "resumed" in text:
        trial.problems.append("training resumed from the corrupt checkpoint")
    if checkpoint.exists():
        trial.problems.append("the checkpoint is still there after the job completed")
    trial.message = "job log: " + re.sub(r"checkpoint \S+/", "checkpoint …/", line.strip())
    trial.survived = not trial.problems
    return trial


def _mount_tmpfs(folder: Path, size: int) -> str | None:
    """Mount a tmpfs of ``size`` bytes on ``folder``; None, or why it could not be mounted."""
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"mount exited {proc.returncode}")


def _umount(folder: Path) -> None:
    for args in (["umount", str(folder)], ["umount", "-l", str(folder)]):
        if subprocess.run(args, capture_output=True).returncode == 0:
            return
        time.sleep(1)


def disk_full_trial(ws: Workspace) -> Trial | str:
    """A full disk under simulate_concentration_errors' output folder (a tmpfs of half its reference size): the job
    must fail with one line naming the file and leave nothing on the tmpfs; a plain rerun after the umount restores
    everything. Returns why the fault was skipped instead, if the tmpfs cannot be mounted."""
    folder = ws.root / "results" / RUN / "concentration" / "errors"
    size = max(4096, sum(p.stat().st_size for p in folder.iterdir()) // 2 // 4096 * 4096)
    for path in folder.iterdir():
        path.unlink()
    why = _mount_tmpfs(folder, size)
    if why:
        return f"cannot mount a tmpfs: {why}"
    trial = Trial(survived=False, notes=[f"tmpfs of {size // 1024} KiB"])
    try:
        run = ws.start("--until", "simulate_concentration_errors", "--forcerun", "simulate_concentration_errors",
                       "--cores", "1", "--configfile", SMOKE, tag="disk-full")
        bad = ws.watch(run)
        out = run.output()
        _check_failure(trial, run.proc.returncode, out, bad, "simulate_concentration_errors")
        error = re.search(r"^error: (\S+): could not be written \((.*?)\)", out, flags=re.M)
        if not error or not error.group(1).endswith("errors/gaussian.parquet"):
            trial.problems.append("no one-line error naming the file")
        left = sorted(p.name for p in folder.iterdir())
        if left:
            trial.problems.append(f"left on the full tmpfs: {left}")
    finally:
        _umount(folder)
    recover(ws, trial, "disk-full")
    return trial


def _wait_all(ws: Workspace, runs: list[SnakemakeRun], timeout: float = 1800) -> set[str]:
    """Audit the smoke run's files every 50 ms until every run has exited; the files seen not bit-identical."""
    bad: set[str] = set()
    deadline = time.monotonic() + timeout
    while any(r.running() for r in runs) and time.monotonic() < deadline:
        bad.update(ws.audit())
        time.sleep(0.05)
    for r in runs:
        if r.running():
            kill_group(r.pid)
        r.wait(60)
    return bad | set(ws.audit())


def _finish(ws: Workspace, trial: Trial, bad: set[str], tag: str, extra_lost: int = 0) -> Trial:
    """Count what a trial lost as it stands (no rerun), then restore the workspace if needed."""
    if bad:
        trial.problems.append("partial or different Parquet seen: " + ", ".join(sorted(bad)))
    lost = ws.lost()
    trial.lost = len(lost) + extra_lost
    if lost:
        trial.problems.append("lost: " + ", ".join(lost))
    rc, out = ws.run("-n", *PLAIN, tag=f"{tag}-dry-run")
    if rc != 0 or "Nothing to be done" not in out:
        trial.problems.append(f"the plain dry run afterwards is not a no-op: {user_message(out) or _rebuilt(out)}")
    if trial.problems:
        before = trial.lost
        recover(ws, trial, tag)
        trial.lost = max(before, trial.lost)
    trial.survived = not trial.problems
    return trial


def concurrent_same_trial(ws: Workspace) -> Trial:
    """``snakemake --forcerun train --cores 1`` twice at once: the second must be refused by Snakemake's lock (or
    wait), the first complete, and the data stay bit-identical."""
    args = ("--forcerun", "train", "--cores", "1", "--configfile", SMOKE)
    first = ws.start(*args, tag="same-run-first")
    trial = Trial(survived=False)
    if not wait_until(lambda: job_pids(ws.root, "train"), 600, give_up=lambda: not first.running()):
        trial.problems.append("the first run started no train job")
    second = ws.start(*args, tag="same-run-second")
    bad = _wait_all(ws, [first, second])
    out2 = second.output()
    if first.proc.returncode != 0:
        trial.problems.append(f"the first run failed: {user_message(first.output())}")
    if second.proc.returncode != 0 and LOCKED not in out2:
        trial.problems.append(f"the second run failed without the lock message: {user_message(out2)}")
    if second.proc.returncode == 0:
        trial.notes.append("the second run was not refused (it waited or found nothing to do)")
    trial.message = "second run: " + (user_message(out2) or "(no error)")
    return _finish(ws, trial, bad, "same-run")


def _remove_run(ws: Workspace, run: str) -> None:
    for top in ("results", "figures", "logs", "benchmarks"):
        subprocess.run(["rm", "-rf", str(ws.root / top / run)], check=True)


def compare_runs(ws: Workspace, other: str) -> tuple[list[str], bool]:
    """Reference files whose counterpart in results/<other>/ is missing or holds another table (schema metadata
    dropped), and whether the provenance is identical too."""
    import pyarrow.parquet as pq

    differ, same_provenance = [], True
    for rel in ws.reference:
        theirs = ws.root / rel.replace(f"results/{RUN}/", f"results/{other}/", 1)
        if not theirs.exists():
            differ.append(rel)
            continue
        a, b = pq.read_table(ws.root / rel), pq.read_table(theirs)
        if not a.replace_schema_metadata(None).equals(b.replace_schema_metadata(None)):
            differ.append(rel)
        same_provenance &= a.schema.metadata == b.schema.metadata
    extra = set(ws.parquet_files(other)) - {r.replace(f"results/{RUN}/", f"results/{other}/", 1) for r in ws.reference}
    return differ + sorted(extra), same_provenance


def concurrent_runs_trial(ws: Workspace, other: str = "faults_b") -> Trial:
    """A forced smoke run and the whole DAG of a second run (overlay ``run: faults_b``) at once: both complete, and
    the second run's tables equal the smoke run's."""
    overlay = ws.root / "config" / f"{other}.yaml"
    overlay.write_text(f"# the smoke run under another name (tests/faults/campaign.py)\nrun: {other}\n")
    _remove_run(ws, other)
    smoke = ws.start("--forcerun", "train", "--cores", "1", "--configfile", SMOKE, tag="two-runs-smoke")
    second = ws.start("--cores", "1", "--configfile", SMOKE, f"config/{other}.yaml", tag=f"two-runs-{other}")
    bad = _wait_all(ws, [smoke, second])
    trial = Trial(survived=False)
    for name, run in (("smoke", smoke), (other, second)):
        if run.proc.returncode != 0:
            trial.problems.append(f"the {name} run failed: {user_message(run.output())}")
    differ, same_provenance = compare_runs(ws, other)
    if differ:
        trial.problems.append(f"results/{other}/ differs from results/{RUN}/: " + ", ".join(differ))
    trial.notes.append("provenance identical as well" if same_provenance else "provenance differs (data equal)")
    trial.message = "(none: both runs complete)" if not trial.problems else user_message(second.output() + smoke.output())
    _finish(ws, trial, bad, "two-runs", extra_lost=len(differ))
    _remove_run(ws, other)
    overlay.unlink()
    return trial
