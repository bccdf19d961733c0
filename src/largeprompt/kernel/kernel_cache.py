"""The per-machine cache file of :mod:`largeprompt.kernel.autotune`: its path, an exclusive lock, atomic reads and
writes, and the CPU model that names a machine.

``$XDG_CACHE_HOME/largeprompt/attention_kernels.json`` (``~/.cache/largeprompt``) holds
``{"format": CACHE_FORMAT, "machines": {machine key: {regime key: entry}}}``; a file of another format,
or one that does not parse, reads as empty and is rewritten.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
from pathlib import Path

CACHE_FORMAT = 2


def cpu_model() -> str:
    """The CPU's model string from /proc/cpuinfo ('model name'), or platform's guess."""
    try:
        with open("/proc/cpuinfo") as fh:
            for row in fh:
                if row.lower().startswith(("model name", "hardware", "cpu model")):
                    return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "largeprompt" / "attention_kernels.json"


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive advisory lock on ``path`` (a no-op where fcntl does not exist)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            import fcntl
        except ImportError:  # not POSIX
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_cache(path: Path | None = None) -> dict:
    """The cache's {machine key: {regime key: entry}}; {} if missing or corrupt."""
    try:
        data = json.loads((path or cache_file()).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("machines"), dict):
        return {}
    return {m: e for m, e in data["machines"].items() if isinstance(e, dict)}


def write_cache(path: Path, machines: dict) -> None:
    """Replace the cache file atomically (temporary file in the same folder, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"format": CACHE_FORMAT, "machines": machines}, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached_or_tuned(machine: str, regime: str, field: str, parse, tune):
    """(choice, 'cache' | 'tuned') of ``regime`` on ``machine``: the cached entry's ``field`` read by ``parse`` (None
    if unusable), else ``tune()`` → (choice, {candidate: seconds}) under the cache's lock, written back atomically.
    A job that finds the lock held waits and re-reads, so concurrent jobs agree: the first writer wins."""

    def cached(machines: dict):
        entry = machines.get(machine, {}).get(regime)
        text = entry.get(field) if isinstance(entry, dict) else None
        return parse(text) if isinstance(text, str) else None

    path = cache_file()
    choice = cached(read_cache(path))
    if choice is not None:
        return choice, "cache"
    with locked(path.with_name(path.name + ".lock")):
        machines = read_cache(path)  # another job may have tuned while we waited for the lock
        choice = cached(machines)
        if choice is not None:
            return choice, "cache"
        choice, seconds = tune()
        machines.setdefault(machine, {})[regime] = {field: str(choice), "seconds": {str(k): s for k, s in seconds.items()}}
        write_cache(path, machines)
        return choice, "tuned"
