import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from largeprompt.bench import copy_worktree

REPO = Path(__file__).resolve().parents[1]

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def private_kernel_cache(tmp_path_factory):
    """Kernel tiles (largeprompt.autotune) are tuned into a temporary XDG_CACHE_HOME, never the user's cache.

    Set in os.environ, so Snakemake jobs and other subprocesses of the tests inherit it.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
        yield


def snakemake_cmd(*args):
    """Snakemake from this interpreter's environment."""
    return [sys.executable, "-m", "snakemake", *args]


def run(cmd, cwd, timeout=600, check=True, env=None):
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def copy_repo(dest: Path) -> Path:
    """A copy of the repository's shipped files (no results, logs or venv) in ``dest``."""
    return copy_worktree(REPO, dest)
