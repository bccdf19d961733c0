"""The smoke DAG on a real single-node SLURM cluster through the Snakemake SLURM executor plugin.

`workflow/cluster/start-slurm.sh` starts munged, MariaDB, slurmdbd, slurmctld and slurmd on this
machine; the smoke DAG then runs with `--workflow-profile` of the SLURM profile in one copy of the
repository and with `--cores 2` in another. Checked: every job of a rule not declared local (figures and
summaries are) went through sbatch, with its rule's threads, mem_mb and runtime as the job's CPUs, memory
and time limit (sacct); every Parquet table
equals the local run's (provenance metadata aside); a training job that fails inside SLURM is
reported with its rule, SLURM job id and log, and the rerun resumes from its checkpoint.

Needs root and Debian's packages (CI's `.ci/run` installs them); skipped elsewhere.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from helpers import REPO, SMOKE, copy_repo, run, snakemake_cmd, workflow_rules

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
CLUSTER_DIR = Path(os.environ.get("LARGEPROMPT_SLURM_DIR", "/tmp/largeprompt-slurm"))
SLURM_CONF = CLUSTER_DIR / "etc" / "slurm.conf"
START, STOP = REPO / "workflow" / "cluster" / "start-slurm.sh", REPO / "workflow" / "cluster" / "stop-slurm.sh"
DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmdbd", "/usr/sbin/munged", "/usr/sbin/mariadbd")
HOW = "run it as root on Debian with apt reachable, as CI does (`.ci/run`), e.g. `sudo .venv/bin/python -m pytest -m slurm tests/test_slurm.py`"
# Same on both sides: one cluster rule with 2 threads (if the node has 2 CPUs), so the CPU mapping is not only 1 -> 1.
THREADED = "make_icl_test_set"
THREADS = ("--set-threads", f"{THREADED}={min(2, os.cpu_count() or 1)}")
# Poll the cluster every few seconds instead of the plugin's 40 s default; keep every job's log.
POLL = ("--slurm-init-seconds-before-status-checks", "2", "--slurm-keep-successful-logs")


def _skip_reason():
    if os.geteuid() != 0:
        return f"SLURM test needs root (it starts the SLURM daemons); {HOW}"
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm is not installed: pip install -r requirements.lock -e ."
    if not all(Path(d).exists() for d in DAEMONS) and shutil.which("apt-get") is None:
        return f"SLURM is not installed and apt-get is not available; {HOW}"
    conf = Path("/etc/slurm/slurm.conf")
    if (conf.exists() or conf.is_symlink()) and not (conf.is_symlink() and os.readlink(conf) == str(SLURM_CONF)):
        return f"{conf} belongs to another SLURM installation; start-slurm.sh will not replace it"
    return None


if _skip_reason():
    pytest.skip(_skip_reason(), allow_module_level=True)


def _cluster_running() -> bool:
    """Whether start-slurm.sh's slurmctld is up (then the cluster was started before this test and is left running)."""
    try:
        pid = int((CLUSTER_DIR / "run" / "slurmctld.pid").read_text())
        return Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld"
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="module")
def cluster():
    """The single-node cluster; stopped afterwards unless it was already running."""
    was_running = _cluster_running()
    proc = run(["bash", str(START)], cwd=REPO, timeout=1800)
    print(proc.stdout)
    yield {"SLURM_CONF": str(SLURM_CONF)}
    if not was_running:
        run(["bash", str(STOP)], cwd=REPO, check=False)


def _profile(work: Path) -> Path:
    """The SLURM workflow profile, pointed at the test cluster's partition and account."""
    path = next(p for p in (work / "profiles" / "slurm", work / "workflow" / "profiles" / "slurm") if p.is_dir())
    config_file = path / "config.yaml"
    profile = yaml.safe_load(config_file.read_text())
    profile["default-resources"].update(slurm_partition="cpu", slurm_account="largeprompt")
    config_file.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path.relative_to(work)


def _own_library(work: Path) -> dict:
    """Environment in which a copy (and its SLURM jobs) import the library copied with it, not the working tree's."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(work / "src"), os.environ.get("PYTHONPATH")]))}


def _slurm_snakemake(work: Path, env, *args, configfiles=(SMOKE,), check=True):
    cmd = snakemake_cmd("--workflow-profile", str(_profile(work)), "--configfile", *configfiles, *args, *POLL)
    return run(cmd, cwd=work, env={**env, **_own_library(work)}, timeout=1800, check=check)


@pytest.fixture(scope="module")
def smoke(cluster, smoke_run, tmp_path_factory):
    """The smoke DAG through SLURM in its own copy; the session's local smoke run (--cores 2) is the reference."""
    remote = copy_repo(tmp_path_factory.mktemp("slurm") / "slurm")
    subprocess.run(["git", "init", "-q"], cwd=remote, check=True)
    start = time.perf_counter()
    proc = _slurm_snakemake(remote, cluster, *THREADS)
    print(f"smoke DAG through SLURM: {time.perf_counter() - start:.0f} s")
    return smoke_run[0], remote, proc.stdout + proc.stderr


def scheduled_jobs(output: str) -> dict[str, dict]:
    """Snakemake job id -> rule, local or not, threads, resources, logs and SLURM job id, from its output."""
    jobs = {}
    for m in re.finditer(r"^(local)?rule (\w+):\n((?:    .*\n)*)", output, flags=re.M):
        fields = dict(re.findall(r"^    (\w+): (.*)$", m.group(3), flags=re.M))
        resources = dict(kv.split("=", 1) for kv in fields.get("resources", "").split(", ") if "=" in kv)
        jobs[fields["jobid"]] = {
            "rule": m.group(2),
            "local": bool(m.group(1)),
            "outputs": fields.get("output", ""),
            "threads": int(fields.get("threads", 1)),
            "resources": resources,
            "logs": [s.split(" (")[0] for s in fields.get("log", "").split(", ") if s],
        }
    for jobid, slurm_id, log in re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (.*?)\)\.", output):
        jobs[jobid].update(slurm_id=slurm_id, slurm_log=log)
    return jobs


def sacct(slurm_ids, env) -> dict[str, dict]:
    fields = ["JobIDRaw", "JobName", "Comment", "AllocCPUS", "ReqMem", "Timelimit", "Elapsed", "State"]
    proc = run(["sacct", "-X", "-P", "-n", "-j", ",".join(slurm_ids), "-o", ",".join(fields)], cwd=REPO, env=env)
    rows = [dict(zip(fields, line.split("|"))) for line in proc.stdout.splitlines() if line]
    return {row["JobIDRaw"]: row for row in rows}


def minutes(limit: str) -> int:
    """SLURM's [D-]HH:MM:SS time limit in minutes."""
    days, _, clock = limit.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days or 0) * 24 + h) * 60 + m + (s > 0)


def test_every_job_went_through_sbatch_with_its_resources(smoke, cluster):
    _, _, output = smoke
    jobs = scheduled_jobs(output)
    run_id = re.search(r"SLURM run ID: (\S+)", output).group(1)
    declared_local = {name for name, rule in workflow_rules().items() if rule.local}
    assert not workflow_rules()[THREADED].local
    local_with_outputs = {j["rule"] for j in jobs.values() if j["local"] and j["outputs"]}
    assert local_with_outputs <= declared_local, f"jobs run outside SLURM: {local_with_outputs - declared_local}"
    assert not {j["rule"] for j in jobs.values() if not j["local"]} & declared_local, "a local rule went to SLURM"
    remote = {k: j for k, j in jobs.items() if not j["local"]}
    assert remote and all("slurm_id" in j for j in remote.values()), "a job was not submitted with sbatch"
    accounting = sacct([j["slurm_id"] for j in remote.values()], cluster)
    print(f"sacct for SLURM run {run_id}:")
    for j in sorted(remote.values(), key=lambda j: int(j["slurm_id"])):
        row = accounting[j["slurm_id"]]
        print("  " + " | ".join(row[k] for k in ("JobIDRaw", "Comment", "AllocCPUS", "ReqMem", "Timelimit", "Elapsed", "State")))
        assert row["JobName"] == run_id and row["State"] == "COMPLETED", row
        assert row["Comment"].startswith(f"rule_{j['rule']}"), row
        assert int(row["AllocCPUS"]) == j["threads"], (j, row)
        assert row["ReqMem"] == f"{j['resources']['mem_mb']}M", (j, row)
        assert minutes(row["Timelimit"]) == int(j["resources"]["runtime"]), (j, row)
    assert any(j["threads"] == min(2, os.cpu_count() or 1) and j["rule"] == THREADED for j in remote.values())


def _table(path: Path) -> tuple:
    table = pq.read_table(path)
    return table.schema.remove_metadata(), table.to_pandas()


def _parquet_files(work: Path) -> list[Path]:
    return sorted(p.relative_to(work) for p in (work / "results").rglob("*.parquet"))


def test_parquet_tables_equal_the_local_run(smoke):
    local, remote, _ = smoke
    rel = _parquet_files
    assert rel(local) and rel(local) == rel(remote)
    for path in rel(local):
        (schema_l, frame_l), (schema_r, frame_r) = _table(local / path), _table(remote / path)
        assert schema_l.equals(schema_r, check_metadata=False), path
        pd.testing.assert_frame_equal(frame_l, frame_r, check_exact=True, obj=str(path))
    print(f"{len(rel(local))} Parquet files: tables identical between the local and the SLURM run")


def _training_overlay(work: Path, fatal: bool) -> str:
    """Config overlay: one prompt length, a constant step that diverges within a few steps, a checkpoint every step."""
    smoke = yaml.safe_load((work / SMOKE).read_text())
    schema = yaml.safe_load((work / "workflow" / "schemas" / "config.schema.yaml").read_text())
    keys = schema["properties"]["train"]["properties"]
    lr = min(1e6, keys["lr"].get("maximum", 1e6))
    train = {"prompt_lengths": [max(smoke["train"]["prompt_lengths"])], "lr": lr, "checkpoint_every": 1}
    if "step_size_rule" in keys:  # training time T = sum of the steps: give it ten of them
        train.update(step_size_rule="constant", horizon=10 * lr)
    name = f"config/slurm_{'fatal' if fatal else 'resume'}.yaml"
    (work / name).write_text(yaml.safe_dump({"train": {**train, "fatal_divergence": fatal}}))
    return name


def test_failed_job_is_reported_and_the_rerun_resumes(smoke, cluster, tmp_path):
    # In a copy of the SLURM run: its overlays retrain results/smoke/train/, which the module's run must keep.
    work = copy_repo(tmp_path / "slurm", source=smoke[1])
    failing = _slurm_snakemake(
        work, cluster, "--until", "train", "--retries", "0", configfiles=(SMOKE, _training_overlay(work, fatal=True)), check=False
    )
    output = failing.stdout + failing.stderr
    assert failing.returncode != 0
    failed = [j for j in scheduled_jobs(output).values() if j["rule"] == "train" and "slurm_id" in j]
    assert failed, output[-3000:]
    errors = re.findall(r"^Error in rule train:\n((?:    .*\n)*)", output, flags=re.M)
    for j in failed:
        block = next((b for b in errors if f"external_jobid: {j['slurm_id']}\n" in b), None)
        assert block, f"no error report for SLURM job {j['slurm_id']}:\n{output[-3000:]}"
        assert f"SLURM-job '{j['slurm_id']}' failed" in block and j["slurm_log"] in block, block
        assert "diverged" in (work / j["slurm_log"]).read_text() + "".join((work / p).read_text() for p in j["logs"])
        assert sacct([j["slurm_id"]], cluster)[j["slurm_id"]]["State"] == "FAILED"
    checkpoints = [p for p in (work / "results").rglob("*") if p.is_file() and "checkpoints" in p.parts]

    rerun = _slurm_snakemake(work, cluster, "--until", "train", configfiles=(SMOKE, _training_overlay(work, fatal=False)))
    jobs = [j for j in scheduled_jobs(rerun.stdout + rerun.stderr).values() if "slurm_id" in j]
    assert jobs and {j["rule"] for j in jobs} == {"train"}, "the rerun redid more than the failed jobs"
    logs = "".join((work / p).read_text() for j in jobs for p in [j["slurm_log"], *j["logs"]])
    print(f"checkpoints after the failure: {[str(p.relative_to(work)) for p in checkpoints]}")
    assert checkpoints, "the failed job wrote no checkpoint before it diverged"
    assert "resumed" in logs, logs[-3000:]
