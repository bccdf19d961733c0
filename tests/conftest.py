import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def private_kernel_cache(tmp_path_factory):
    """Kernel tiles (largeprompt.kernel.autotune) are tuned into a temporary XDG_CACHE_HOME, never the user's cache.

    Set in os.environ, so Snakemake jobs and other subprocesses of the tests inherit it.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
        yield


def snakemake_cmd(*args):
    """Snakemake from this interpreter's environment."""
    return [sys.executable, "-m", "snakemake", *args]


def run(cmd, cwd, timeout=600, check=True, env=None):
    """Run ``cmd`` in ``cwd``; in a copy of the repository, its own src/ comes first on PYTHONPATH (the
    virtual environment's editable install points at REPO)."""
    full_env = dict(os.environ, **(env or {}))
    if (Path(cwd) / "src" / "largeprompt").is_dir():
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(cwd) / "src"), full_env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def copy_repo(dest: Path) -> Path:
    """A copy of the repository's shipped files (no results, logs or venv) in ``dest``: the files git would
    ship from REPO, tracked or untracked but not ignored."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


SMOKE = "config/smoke.yaml"


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The smoke DAG, built once per session in a copy of the repository (its own git repo), and the default
    run's dry run taken before it. The pipeline, report and SLURM tests read it; a test that changes the tree
    puts it back."""
    work = copy_repo(tmp_path_factory.mktemp("smoke") / "repo")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    before = run(snakemake_cmd("-n"), cwd=work)
    proc = run(snakemake_cmd("--cores", "2", "--configfile", SMOKE), cwd=work, timeout=1200)
    return work, proc, before.stdout + before.stderr
