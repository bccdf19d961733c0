"""Fixtures and hooks of the test suite; shared helpers are in tests/helpers.py."""
import subprocess

import pytest
import torch

from helpers import SMOKE, copy_repo, run, snakemake_cmd

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """A test that reads the session's smoke run waits for the whole smoke DAG (over a minute on two cores) unless
    another test built it first: it is slow, whatever its own body costs; so is every SLURM test."""
    for item in items:
        if "smoke_run" in getattr(item, "fixturenames", ()) or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def private_kernel_cache(tmp_path_factory):
    """Kernel tiles (largeprompt.kernel.autotune) are tuned into a temporary XDG_CACHE_HOME, never the user's cache.

    Set in os.environ, so Snakemake jobs and other subprocesses of the tests inherit it.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
        yield


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The smoke DAG, built once per session in a copy of the repository (its own git repo), and the default
    run's dry run taken before it. Shared by the pipeline, report, fingerprint and SLURM tests: read it, never
    edit it; a test that edits files works in its own copy (``helpers.copy_repo(dest, source=work)``)."""
    work = copy_repo(tmp_path_factory.mktemp("smoke") / "repo")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    before = run(snakemake_cmd("-n"), cwd=work)
    proc = run(snakemake_cmd("--cores", "2", "--configfile", SMOKE), cwd=work, timeout=1200)
    return work, proc, before.stdout + before.stderr
