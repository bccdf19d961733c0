"""Provenance recorded in every Parquet file (docs/experiments.md#configurations): config values, seed, versions, git commit."""
from __future__ import annotations

import functools
import importlib.metadata
import platform

from largeprompt.core.devices import resolve_device
from largeprompt.io.repository import git_commit
from largeprompt.kernel.autotune import kernels_used

TRACKED_PACKAGES = ("largeprompt", "numpy", "torch", "pandas", "pyarrow", "scipy", "snakemake")


@functools.cache
def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def provenance(rule: str, params: dict, *, base_seed: int | None = None, run_seeds=None, runtime=None) -> dict:
    """The provenance record for one output of ``rule``.

    ``base_seed`` is the config's ``seed`` (every random stream is keyed by it); ``run_seeds`` lists the
    training seeds of the runs in the file. ``runtime`` holds the settings that cannot change a result
    (device, threads, checkpoint cadence); the device a job actually ran on is recorded with it.
    """
    record = {
        "rule": rule,
        "params": params,
        "base_seed": base_seed,
        "versions": package_versions(),
        "git_commit": git_commit(),
    }
    if run_seeds is not None:
        record["run_seeds"] = [int(s) for s in run_seeds]
    if runtime is not None:
        settings = {k: v for k, v in runtime.__dict__.items() if v is not None}
        record["runtime"] = dict(settings, resolved_device=str(resolve_device(runtime.device)))
    record["attention_kernels"] = kernels_used()  # they set the round-off (largeprompt.kernel.autotune); {} if none ran
    return record
