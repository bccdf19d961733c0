"""Provenance recorded in every Parquet file (SPEC §5): config values, seed, versions, git commit."""
from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path

TRACKED_PACKAGES = ("largeprompt", "numpy", "torch", "pandas", "pyarrow", "scipy", "snakemake")


@functools.lru_cache(maxsize=None)
def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@functools.lru_cache(maxsize=None)
def git_commit(path: str = str(Path(__file__).parent)) -> str:
    """HEAD of the repository containing ``path`` with '-dirty' if tracked files changed; 'unknown' outside git."""
    cwd = Path(path).resolve()
    if not cwd.is_dir():
        cwd = cwd.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def provenance(rule: str, params: dict, seed: int | None) -> dict:
    """The provenance record for one output of ``rule``.

    Random streams differ between CPU and CUDA generators, so the device a ``device: auto`` job
    actually ran on is recorded too.
    """
    record = {
        "rule": rule,
        "params": params,
        "seed": seed,
        "versions": package_versions(),
        "git_commit": git_commit(),
    }
    if isinstance(params, dict) and "device" in params:
        from .runlog import resolve_device

        record["resolved_device"] = str(resolve_device(params["device"]))
    return record
