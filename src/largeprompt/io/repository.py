"""The commit a result comes from (docs/experiments.md#configurations), without importing torch (plot jobs use it)."""
from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path


@functools.cache
def git_commit(path: str | None = None) -> str:
    """HEAD of the repository holding ``path`` (default: the working directory, where Snakemake runs the
    workflow) with '-dirty' if tracked files changed; 'unknown' outside git."""
    cwd = Path(path or os.getcwd()).resolve()
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
