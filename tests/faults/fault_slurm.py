"""The campaign's SLURM faults (docs/reliability.md): on the single-node cluster of workflow/cluster/start-slurm.sh,
a training job run through the SLURM profile is cancelled with ``scancel``, runs past its time limit, sees its
node's slurmd killed and restarted, or loses its node (slurmd, the job's slurmstepd and its processes killed, the
node back 30 s later). A cancelled or timed-out job must be reported by Snakemake naming the rule and the SLURM job
id; a job that outlives a slurmd restart must complete; a job on a lost node must be either requeued by SLURM and
complete, or reported. Then a plain rerun through SLURM must leave every file bit-identical to the local reference.

The SLURM runs happen in a clone of the campaign's workspace (its smoke results, git commit and Snakemake records),
with the profile of tests/test_slurm.py (partition ``cpu``, account ``largeprompt``) written to the untracked
``.campaign/slurm/`` so the commit recorded in provenance stays clean and rebuilt files are bit-identical to the
local reference. Needs root and Debian's SLURM packages; skipped, with the reason, elsewhere.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from fault_procs import alive, cmdline, job_pids, kill, kill_group, pids, wait_until, working_dir
from fault_report import Fault, Trial
from fault_workspace import RUN, SnakemakeRun, Workspace, brief, user_message

from helpers import REPO, SMOKE

CLUSTER_DIR = Path(os.environ.get("LARGEPROMPT_SLURM_DIR", "/tmp/largeprompt-slurm"))
SLURM_CONF = CLUSTER_DIR / "etc" / "slurm.conf"
START, STOP = REPO / "workflow" / "cluster" / "start-slurm.sh", REPO / "workflow" / "cluster" / "stop-slurm.sh"
PROFILE = ".campaign/slurm"
POLL = ("--slurm-init-seconds-before-status-checks", "2", "--slurm-keep-successful-logs", "--retries", "0")
DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmdbd", "/usr/sbin/munged", "/usr/sbin/mariadbd")
REPORT_WAIT = 180  # s: the plugin checks job states at most 180 s apart (its max_sleep_time)
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (the campaign starts the SLURM daemons)"
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm is not installed"
    if not all(Path(d).exists() for d in DAEMONS) and shutil.which("apt-get") is None:
        return "SLURM is not installed and apt-get is not available"
    conf = Path("/etc/slurm/slurm.conf")
    if (conf.exists() or conf.is_symlink()) and not (conf.is_symlink() and os.readlink(conf) == str(SLURM_CONF)):
        return f"{conf} belongs to another SLURM installation"
    return None


def _daemon_pid(name: str) -> int | None:
    """The pid of start-slurm.sh's ``name`` daemon if it runs."""
    try:
        pid = int((CLUSTER_DIR / "run" / f"{name}.pid").read_text())
        return pid if Path(f"/proc/{pid}/comm").read_text().strip() == name and alive(pid) else None
    except (OSError, ValueError):
        return None


@dataclass
class Cluster:
    """The single-node cluster and the workspace clone whose runs go through it."""

    ws: Workspace | None = None
    skipped: str | None = None
    was_running: bool = False
    env: dict = field(default_factory=lambda: {"SLURM_CONF": str(SLURM_CONF)})

    @classmethod
    def start(cls, ws: Workspace, say) -> Cluster:
        why = _skip_reason()
        if why:
            return cls(skipped=why)
        cluster = cls(was_running=_daemon_pid("slurmctld") is not None)
        for args in (["--install-only"], []):
            proc = subprocess.run(["bash", str(START), *args], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                return cls(skipped=f"start-slurm.sh {' '.join(args)} failed: {proc.stderr.strip()[-300:]}")
        say(f"SLURM cluster up ({'already running' if cluster.was_running else 'started'})")
        cluster.ws = ws.clone(ws.base / "slurm")
        profile = yaml.safe_load((cluster.ws.root / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
        profile["default-resources"].update(slurm_partition="cpu", slurm_account="largeprompt")
        (cluster.ws.root / PROFILE).mkdir(parents=True)
        (cluster.ws.root / PROFILE / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
        return cluster

    def stop(self, say) -> None:
        """Stop the cluster unless it ran before the campaign or runs other people's jobs."""
        if self.skipped or self.was_running:
            return
        others = self.squeue()
        if others:
            say(f"SLURM cluster left running: jobs {sorted(others)} of other runs are queued")
            return
        subprocess.run(["bash", str(STOP)], capture_output=True, timeout=600)
        say("SLURM cluster stopped")

    def squeue(self) -> dict[str, tuple[str, str]]:
        """Queued and running jobs: SLURM id -> (state, job name = Snakemake's run id)."""
        proc = subprocess.run(["squeue", "-h", "-o", "%i|%T|%j"], capture_output=True, text=True, env=dict(os.environ, **self.env))
        return {i: (s, n) for i, s, n in (ln.split("|", 2) for ln in proc.stdout.splitlines() if ln.count("|") == 2)}

    def state(self, slurm_id: str) -> str:
        proc = subprocess.run(["sacct", "-X", "-n", "-P", "-j", slurm_id, "-o", "State"], capture_output=True, text=True,
                              env=dict(os.environ, **self.env))
        return proc.stdout.strip()

    def history(self, slurm_id: str) -> str:
        """Every state SLURM recorded for the job, requeues included (``sacct -D``), e.g. 'NODE_FAIL, COMPLETED'."""
        proc = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-j", slurm_id, "-o", "State"], capture_output=True,
                              text=True, env=dict(os.environ, **self.env))
        return ", ".join(proc.stdout.split("\n")).strip(", ") or "no record"

    def scancel(self, *ids: str) -> None:
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, env=dict(os.environ, **self.env))

    def snakemake(self, *args: str, tag: str, configfiles=(SMOKE,)) -> SnakemakeRun:
        """``snakemake ARGS --workflow-profile <the campaign's SLURM profile> … --configfile FILES`` in the clone."""
        return self.ws.start(*args, "--workflow-profile", PROFILE, *POLL, "--configfile", *configfiles, tag=tag, env=self.env)


def _submitted(run: SnakemakeRun) -> str | None:
    """The SLURM id of the run's first submitted job, once it is submitted."""
    m = SUBMITTED.search(run.output())
    return m.group(2) if m else None


def _report(out: str, slurm_id: str) -> str | None:
    """The 'Error in rule train:' block of Snakemake's output that names SLURM job ``slurm_id``."""
    for block in re.findall(r"^Error in rule train:\n((?:    .*\n)*)", out, flags=re.M):
        if f"external_jobid: {slurm_id}\n" in block or f"SLURM-job '{slurm_id}'" in block:
            return block
    return None


def _wait_for_job(cluster: Cluster, run: SnakemakeRun, timeout: float = 600) -> str | None:
    """Wait until the run's train job runs its script on the node; its SLURM id (None if it never did)."""
    slurm_id = wait_until(lambda: _submitted(run), timeout, 0.2, give_up=lambda: not run.running())
    if slurm_id and wait_until(lambda: job_pids(cluster.ws.root, "train"), timeout, 0.05, give_up=lambda: not run.running()):
        return slurm_id
    return None


def _end(cluster: Cluster, run: SnakemakeRun, trial: Trial) -> None:
    """End a run that did not report: Ctrl-C (the plugin then cancels its jobs), SIGKILL after 120 s, then cancel
    whatever of its jobs is still queued."""
    run_id = re.search(r"SLURM run ID: (\S+)", run.output())
    kill(run.pid, signal.SIGINT)
    if wait_until(lambda: not run.running(), 120, 0.5) is None:
        trial.notes.append("Snakemake still running 120 s after Ctrl-C: killed")
        kill_group(run.pid)
    run.wait(60)
    if run_id:
        cluster.scancel(*[i for i, (_, name) in cluster.squeue().items() if name == run_id.group(1)])


def _outcome(cluster: Cluster, run: SnakemakeRun, slurm_id: str, trial: Trial, wait: float) -> set[str]:
    """Wait (at most ``wait`` s after the fault) for Snakemake to report the failure naming the rule and the job,
    auditing the results meanwhile; the files seen not bit-identical."""
    bad: set[str] = set()

    def reported():
        bad.update(cluster.ws.audit())
        return _report(run.output(), slurm_id)

    block = wait_until(reported, wait, 0.5, give_up=lambda: not run.running())
    state = cluster.state(slurm_id)
    if not block:
        trial.problems.append(f"Snakemake did not report SLURM job {slurm_id} within {wait:.0f} s (sacct State: '{state}')")
        trial.message = f"(nothing within {wait:.0f} s; sacct State '{state}', squeue " + \
            f"{cluster.squeue().get(slurm_id, ('gone',))[0]})"
        _end(cluster, run, trial)
        return bad
    if wait_until(lambda: not run.running(), 300, 0.5) is None:
        _end(cluster, run, trial)
    if run.proc.returncode == 0:
        trial.problems.append("Snakemake exited 0 after a failed job")
    message = re.search(r"message: (.*)", block)
    trial.message = "Error in rule train: " + brief(message.group(1) if message else block.splitlines()[0])[:200]
    return bad


def _recover(cluster: Cluster, trial: Trial, tag: str, since: float) -> None:
    """The documented recovery through SLURM: the plain command (after --unlock if asked); then the files lost."""
    run = cluster.snakemake(tag=f"{tag}-rerun")
    run.wait(1800)
    if run.proc.returncode != 0 and "Directory cannot be locked" in run.output():
        trial.notes.append("stale lock: `snakemake --unlock` needed")
        cluster.ws.unlock()
        run = cluster.snakemake(tag=f"{tag}-rerun-unlocked")
        run.wait(1800)
    if run.proc.returncode != 0:
        trial.problems.append(f"SLURM rerun failed: {user_message(run.output())}")
    lost = cluster.ws.lost()
    trial.lost = len(lost)
    if lost:
        trial.problems.append("lost after the rerun: " + ", ".join(lost))
    logs = [p for p in (cluster.ws.root / "logs" / RUN / "train").glob("L*.log") if p.stat().st_mtime >= since]
    if any("resumed" in p.read_text(errors="replace") for p in logs):
        trial.notes.append("the rerun resumed from a checkpoint")
    cluster.ws.clear_stale_temps()
    trial.survived = not trial.problems


def _completion(cluster: Cluster, run: SnakemakeRun, slurm_id: str, trial: Trial, wait: float) -> set[str]:
    """Wait (at most ``wait`` s) for a run whose job should survive the fault to finish by itself; it must exit 0.
    The files seen not bit-identical meanwhile."""
    bad: set[str] = set()
    wait_until(lambda: bad.update(cluster.ws.audit()) or not run.running(), wait, 0.5)
    history = cluster.history(slurm_id)
    if run.running():
        trial.problems.append(f"the run did not finish within {wait:.0f} s of the fault (sacct: {history})")
        trial.message = f"(still running after {wait:.0f} s; sacct {history})"
        _end(cluster, run, trial)
        return bad
    if run.proc.returncode != 0:
        trial.problems.append(f"the run failed: {user_message(run.output())}")
        trial.message = user_message(run.output())
        return bad
    trial.message = f"(none: the run completes; sacct: {history})"
    return bad


def _report_or_completion(cluster, run, slurm_id, trial, wait) -> set[str]:
    """A lost node: SLURM either requeues the job (it then runs again and the run completes by itself) or fails it
    (Snakemake must report it)."""
    bad = _completion(cluster, run, slurm_id, trial, wait)
    if trial.problems and _report(run.output(), slurm_id):
        trial.problems.clear()
        block = _report(run.output(), slurm_id)
        message = re.search(r"message: (.*)", block)
        trial.message = "Error in rule train: " + brief(message.group(1) if message else block.splitlines()[0])[:200]
    return bad


def slurm_trial(ctx, rng: np.random.Generator, inject, tag: str, extra=(), configfiles=(SMOKE,), wait=REPORT_WAIT,
                outcome=None) -> Trial | str:
    """Force one training job through SLURM, ``inject(cluster, run, slurm_id, trial, rng)`` a fault once the job runs
    its script, check the ``outcome`` (default: Snakemake's report of the failure) and recover through SLURM with
    the plain command."""
    cluster: Cluster = ctx.cluster
    if cluster.skipped:
        return cluster.skipped
    L = int(rng.choice([10, 100]))
    started = time.time()
    run = cluster.snakemake(f"results/{RUN}/train/L{L}.parquet", "--forcerun", "train", *extra, tag=tag, configfiles=configfiles)
    trial, bad = Trial(survived=False, notes=[f"L={L}"]), set()
    slurm_id = _wait_for_job(cluster, run)
    if slurm_id is None:
        trial.problems.append(f"the job never ran: {user_message(run.output())}")
        _end(cluster, run, trial)
    else:
        inject(cluster, run, slurm_id, trial, rng)
        bad = (outcome or _outcome)(cluster, run, slurm_id, trial, wait)
    bad.update(cluster.ws.audit())
    if bad:
        trial.problems.append("partial or different Parquet seen: " + ", ".join(sorted(bad)))
    _recover(cluster, trial, tag, started)
    orphans = _job_processes(cluster.ws.root)
    if orphans:
        trial.notes.append(f"{len(orphans)} job processes still running after the rerun: killed")
        for pid in orphans:
            kill(pid)
    return trial


def _job_processes(root: Path, besides: int | None = None) -> list[int]:
    """Processes working in the clone ``root`` outside the session ``besides`` (Snakemake's own): the SLURM jobs'."""
    return pids(lambda pid: working_dir(pid) == str(root) and os.getsid(pid) != besides)


def _stepds(slurm_id: str) -> list[int]:
    """The slurmstepd processes of SLURM job ``slurm_id`` (batch step and job steps)."""
    return pids(lambda pid: " ".join(cmdline(pid)).startswith(f"slurmstepd: [{slurm_id}."))


def _scancel(cluster: Cluster, run: SnakemakeRun, slurm_id: str, trial: Trial, rng) -> None:
    delay = float(rng.uniform(0, 3))
    time.sleep(delay)
    cluster.scancel(slurm_id)
    trial.notes.append(f"scancel {delay:.1f} s after the job's script started")


def _restart_slurmd(trial: Trial) -> None:
    proc = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        trial.problems.append(f"start-slurm.sh could not restart slurmd: {proc.stderr.strip().splitlines()[-1:]}")


def _kill_slurmd(cluster: Cluster, run: SnakemakeRun, slurm_id: str, trial: Trial, rng) -> None:
    """SIGKILL slurmd alone, then start-slurm.sh restarts it: the job's slurmstepd carries on, and the new slurmd
    finds it again."""
    delay = float(rng.uniform(0, 3))
    time.sleep(delay)
    kill(_daemon_pid("slurmd") or -1)
    time.sleep(2)
    _restart_slurmd(trial)
    trial.notes.append(f"slurmd killed {delay:.1f} s into the job and restarted")


NODE_DOWN = 30  # s: longer than BatchStartTimeout + MessageTimeout (10 + 10 s), so the returning node's registration
# without the job makes slurmctld end it ("missing from batch node"): NODE_FAIL, then requeued under JobRequeue=1


def _lose_node(cluster: Cluster, run: SnakemakeRun, slurm_id: str, trial: Trial, rng) -> None:
    """A node crash: SIGKILL slurmd, the job's slurmstepd and every process of the job, then slurmd back after
    NODE_DOWN s."""
    delay = float(rng.uniform(0, 3))
    time.sleep(delay)
    stepds = _stepds(slurm_id)
    for pid in filter(None, [_daemon_pid("slurmd"), *stepds]):
        kill(pid)
    victims = _job_processes(cluster.ws.root, besides=os.getsid(run.pid))
    for pid in victims:
        kill(pid)
    time.sleep(NODE_DOWN)
    _restart_slurmd(trial)
    trial.notes.append(f"node lost {delay:.1f} s into the job (slurmd, {len(stepds)} slurmstepd and {len(victims)} job "
                       f"processes killed), back after {NODE_DOWN} s")


def _overtime(cluster: Cluster, run: SnakemakeRun, slurm_id: str, trial: Trial, rng) -> None:
    trial.notes.append(f"time limit 1 min, training {SLOW_STEPS} steps per run")


SLOW_LR = 1.0e-5  # constant steps over the smoke horizon of 4: 400 000 steps per run, over 5 min here (40 000
SLOW_STEPS = "400 000"  # steps still finished inside SLURM's enforcement of a 1-minute limit, checked every 30 s)


def _slow_overlay(cluster: Cluster) -> str:
    """Config overlay: the same run and horizon (so nothing upstream of train changes and only the train job is
    submitted), constant steps of SLOW_LR: minutes of training against a 1-minute limit; a checkpoint every 1000."""
    name = "config/faults_slow.yaml"
    (cluster.ws.root / name).write_text(yaml.safe_dump({"train": {"step_size_rule": "constant", "lr": SLOW_LR,
                                                                  "checkpoint_every": 1000}}))
    return name


def _exclusive(ctx, wait: float = 300) -> str | None:
    """Wait until no other run's job is queued (killing slurmd would disturb them); why not, after ``wait`` s."""
    if ctx.cluster.skipped:
        return ctx.cluster.skipped
    if wait_until(lambda: not ctx.cluster.squeue(), wait, 2):
        return None
    return f"other runs' jobs kept the cluster busy for {wait} s: {sorted(ctx.cluster.squeue())}"


def _slurmd_trial(ctx, rng, i):
    return _exclusive(ctx) or slurm_trial(ctx, rng, _kill_slurmd, "slurm-slurmd", outcome=_completion, wait=600)


def _node_lost_trial(ctx, rng, i):
    # SLURM requeues a NODE_FAIL job after about 2 min (BeginTime); then the job runs again
    return _exclusive(ctx) or slurm_trial(ctx, rng, _lose_node, "slurm-node-lost", outcome=_report_or_completion, wait=900)


def _timeout_trial(ctx, rng, i):
    if ctx.cluster.skipped:
        return ctx.cluster.skipped
    return slurm_trial(ctx, rng, _overtime, "slurm-timeout", extra=("--set-resources", "train:runtime=1"),
                       configfiles=(SMOKE, _slow_overlay(ctx.cluster)), wait=REPORT_WAIT + 120)


FAULTS = [
    Fault("slurm_scancel", "SLURM: `scancel` of a running `train` job", 3,
          lambda ctx, rng, i: slurm_trial(ctx, rng, _scancel, "slurm-scancel"), "slurm"),
    Fault("slurm_slurmd", "SLURM: slurmd killed during a `train` job and restarted", 3, _slurmd_trial, "slurm"),
    Fault("slurm_node_lost", "SLURM: the node lost during a `train` job (slurmd, slurmstepd and the job killed; back 30 s later)",
          3, _node_lost_trial, "slurm"),
    Fault("slurm_timeout", "SLURM: a `train` job over its time limit (`--set-resources train:runtime=1`)", 3, _timeout_trial, "slurm"),
]
