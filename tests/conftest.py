import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

torch.set_num_threads(1)


@pytest.fixture
def float64():
    return torch.float64


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
    """Copy the files git would ship (tracked and untracked-not-ignored) into ``dest``."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if not src.is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(src.read_bytes())
    return dest
