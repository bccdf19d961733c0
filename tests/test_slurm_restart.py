"""workflow/cluster/start-slurm.sh and stop-slurm.sh restarted in a loop on a loaded machine.

A busy loop on every core runs beside the cluster, so each daemon takes its time to exec and come up (the
start script once took a daemon still being exec'd for a dead one). Five times in one test: start, check
that the controller answers and the node is idle, run an `sbatch --wrap` job to COMPLETED in the accounting
(sacct), stop, and check that no daemon of this cluster and none of its sockets, pid files or the
/etc/slurm/slurm.conf symlink is left. A second test blocks slurmctld's port: the failed start must name
slurmctld and its log and stop the daemons it had started.

The cluster here has its own directory and ports (LARGEPROMPT_SLURM_DIR, LARGEPROMPT_SLURM_PORT), apart from
the default /tmp/largeprompt-slurm on ports 16800+ that tests/test_slurm.py starts. Needs root and Debian's
packages (CI's `.ci/run` installs them; start-slurm.sh apt-get installs them when missing); skipped elsewhere.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import REPO, run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BASE = Path("/tmp/largeprompt-slurm-restart")
PORT = 17800  # MariaDB +6, slurmctld +17, slurmd +18, slurmdbd +19; the default cluster's base is 16800
ENV = {"LARGEPROMPT_SLURM_DIR": str(BASE), "LARGEPROMPT_SLURM_PORT": str(PORT), "SLURM_CONF": str(BASE / "etc" / "slurm.conf")}
START, STOP = REPO / "workflow" / "cluster" / "start-slurm.sh", REPO / "workflow" / "cluster" / "stop-slurm.sh"
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
BINARIES = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmdbd", "/usr/sbin/munged", "/usr/sbin/mariadbd")
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
CYCLES = 5
HOW = "run it as root on Debian with apt reachable, as CI does (`.ci/run`), e.g. `sudo .venv/bin/python -m pytest -m slurm`"


def _skip_reason():
    if os.geteuid() != 0:
        return f"SLURM restart test needs root (it starts the SLURM daemons); {HOW}"
    if not all(Path(b).exists() for b in BINARIES) and shutil.which("apt-get") is None:
        return f"SLURM is not installed and apt-get is not available; {HOW}"
    return None


if _skip_reason():
    pytest.skip(_skip_reason(), allow_module_level=True)


def _skip_if_default_config_taken():
    """start-slurm.sh links /etc/slurm/slurm.conf to its config and never replaces another one: while another
    cluster (tests/test_slurm.py's, or a real one) holds it, this cluster cannot start."""
    ours = str(BASE / "etc" / "slurm.conf")
    if (DEFAULT_CONF.exists() or DEFAULT_CONF.is_symlink()) and not (DEFAULT_CONF.is_symlink() and os.readlink(DEFAULT_CONF) == ours):
        target = os.readlink(DEFAULT_CONF) if DEFAULT_CONF.is_symlink() else "a file"
        pytest.skip(f"{DEFAULT_CONF} is taken ({target}): another SLURM cluster is running; stop it first (workflow/cluster/stop-slurm.sh)")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def leftover_daemons() -> list[str]:
    """Running (not zombie) munged, mariadbd, slurmdbd, slurmctld or slurmd started for BASE: its directory on
    the command line (munged, mariadbd) or its SLURM_CONF in the environment (all of them). A `pgrep` that
    can tell this cluster's daemons from any other's."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or _read(proc / "comm").decode().strip() not in DAEMONS:
            continue
        stat = _read(proc / "stat").decode()
        if stat[stat.rfind(")") + 2 :][:1] in ("Z", "X", ""):  # exited (a zombie only waits to be reaped)
            continue
        cmdline, environ = _read(proc / "cmdline"), _read(proc / "environ").split(b"\0")
        if str(BASE).encode() in cmdline or f"SLURM_CONF={ENV['SLURM_CONF']}".encode() in environ:
            found.append(f"{proc.name} " + cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def leftover_files() -> list[str]:
    """Sockets, pid and lock files left under BASE, and the /etc/slurm/slurm.conf symlink to this cluster."""
    left = [str(p) for p in BASE.rglob("*") if p.is_socket() or p.name.endswith((".pid", ".sock", ".socket", ".lock"))]
    if DEFAULT_CONF.is_symlink() and os.readlink(DEFAULT_CONF) == ENV["SLURM_CONF"]:
        left.append(str(DEFAULT_CONF))
    return left


def start() -> float:
    began = time.perf_counter()
    run(["bash", str(START)], cwd=REPO, env=ENV, timeout=1800)  # the first one may apt-get install the packages
    return time.perf_counter() - began


def stop(*args) -> float:
    began = time.perf_counter()
    run(["bash", str(STOP), *args], cwd=REPO, env=ENV, timeout=600)
    return time.perf_counter() - began


def assert_stopped(when: str):
    assert not leftover_daemons(), f"{when}: daemons left running: {leftover_daemons()}"
    assert not leftover_files(), f"{when}: files left behind: {leftover_files()}"


@contextmanager
def busy_cores():
    """A Python busy loop on every core (at least two), killed on the way out."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(2, os.cpu_count() or 1))]
    try:
        yield
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.wait()


@pytest.fixture
def fresh_cluster_dir():
    """BASE stopped and purged before and after the test, whatever it left."""
    _skip_if_default_config_taken()
    if BASE.exists():
        stop("--purge")
    try:
        yield
    finally:
        if BASE.exists():
            run(["bash", str(STOP), "--purge"], cwd=REPO, env=ENV, timeout=600, check=False)


def assert_up():
    ping = run(["scontrol", "ping"], cwd=REPO, env=ENV).stdout
    assert "UP" in ping, ping
    state = run(["sinfo", "-h", "-n", "localhost", "-o", "%t"], cwd=REPO, env=ENV).stdout.strip()
    assert state == "idle", run(["sinfo", "-N", "-o", "%N %t %E"], cwd=REPO, env=ENV).stdout


def run_job(tag: str) -> str:
    """An sbatch --wrap job, waited for; returns its id once sacct reports it COMPLETED."""
    out = BASE / "log" / f"job-{tag}-%j.out"
    sbatch = ["sbatch", "--parsable", "--wait", "-p", "cpu", "-A", "largeprompt", "-o", str(out), "--wrap", f"echo {tag}"]
    job = run(sbatch, cwd=REPO, env=ENV, timeout=300)
    job_id = job.stdout.strip().split(";")[0]
    deadline, state = time.monotonic() + 120, ""
    while time.monotonic() < deadline:  # the controller hands the job's end to slurmdbd asynchronously
        state = run(["sacct", "-X", "-P", "-n", "-j", job_id, "-o", "State"], cwd=REPO, env=ENV).stdout.strip()
        if state == "COMPLETED":
            return job_id
        time.sleep(1)
    raise AssertionError(f"job {job_id}: sacct says {state!r}, not COMPLETED")


def test_start_stop_five_times_on_a_loaded_machine(fresh_cluster_dir):
    timings, jobs = [], []
    with busy_cores():
        for cycle in range(1, CYCLES + 1):
            up = start()
            assert_up()
            jobs.append(run_job(f"cycle{cycle}"))
            down = stop()
            assert_stopped(f"after stop {cycle}")
            timings.append((up, down))
            print(f"cycle {cycle}: start {up:.1f} s, job {jobs[-1]} COMPLETED, stop {down:.1f} s")
    assert len(set(jobs)) == CYCLES, f"job ids repeat across restarts (controller state lost?): {jobs}"


def test_failed_start_stops_what_it_started(fresh_cluster_dir):
    """slurmctld cannot bind its port: the start fails naming slurmctld and its log, and leaves nothing running."""
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("0.0.0.0", PORT + 17))
        blocker.listen()
        proc = run(["bash", str(START)], cwd=REPO, env=ENV, timeout=1800, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "error: slurmctld exited before it was ready" in proc.stderr, proc.stderr
    assert str(BASE / "log" / "slurmctld.log") in proc.stderr, proc.stderr
    assert_stopped("after the failed start")
    start()  # and the next start is clean
    assert_up()
    stop()
    assert_stopped("after the stop")
