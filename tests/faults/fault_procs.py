"""Processes of the fault-injection campaign, read from /proc: the job process Snakemake starts for a rule's
``script:`` in one copy of the repository, the files a process holds open, and small polling helpers.

A job process is ``python <copy>/.snakemake/scripts/tmpXXXX.<rule script>.py`` whose working directory is the
copy; other copies of the repository (other people's test runs, the paper run) are never matched.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


def cmdline(pid: int) -> list[str]:
    """The command line of ``pid`` ([] when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def working_dir(pid: int) -> str | None:
    """The working directory of ``pid`` (None when it is gone)."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[-1][:1] not in ("Z", "X")


def pids(match: Callable[[int], bool]) -> list[int]:
    """The live processes (not zombies) for which ``match(pid)`` holds, sorted; a process that ends while it is
    examined (OSError) is skipped."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if match(int(entry.name)) and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return sorted(found)


def job_pids(root: Path, script: str) -> list[int]:
    """Pids of the running job processes of ``script`` (e.g. "train" for workflow/scripts/train.py) in the copy
    ``root``: a Python whose command line runs ``<root>/.snakemake/scripts/tmp*.<script>.py``, cwd ``root``."""
    prefix, suffix = f"{root}/.snakemake/scripts/", f".{script}.py"

    def is_job(pid: int) -> bool:
        argv = cmdline(pid)
        return (len(argv) >= 2 and Path(argv[0]).name.startswith("python") and working_dir(pid) == str(root)
                and any(a.startswith(prefix) and a.endswith(suffix) for a in argv[1:]))

    return pids(is_job)


def open_files(pid: int, under: Path) -> list[str]:
    """The files under ``under`` that process ``pid`` holds open, relative to ``under`` (its job log, for one)."""
    names = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return names
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{under}/"):
            names.append(target[len(str(under)) + 1:])
    return sorted(names)


def wait_until(condition: Callable[[], object], timeout: float, interval: float = 0.02, give_up: Callable[[], bool] | None = None):
    """Poll ``condition`` until it returns something true (returned) or ``timeout`` s pass or ``give_up()`` (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if give_up is not None and give_up():
            return condition() or None
        time.sleep(interval)
    return None


def _send(send: Callable[[int, int], None], target: int, sig: int) -> bool:
    try:
        send(target, sig)
        return True
    except ProcessLookupError:
        return False


def kill(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to ``pid``; False if it is already gone."""
    return _send(os.kill, pid, sig)


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to every process of the process group ``pgid``; False if none is left."""
    return _send(os.killpg, pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Live processes of the process group ``pgid``."""
    return pids(lambda pid: os.getpgid(pid) == pgid)
