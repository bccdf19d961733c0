"""Helpers shared by the tests: the repository, Snakemake from this interpreter, copies of a checkout, the
workflow's parsed rules, the weights of a trajectory and a native kernel's loader without a compiler. Fixtures and hooks live in tests/conftest.py."""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
SMOKE = "config/smoke.yaml"


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


def copy_repo(dest: Path, source: Path | None = None) -> Path:
    """A copy of a checkout in ``dest``.

    Without ``source``: the files git would ship from REPO (tracked, or untracked but not ignored), so no results,
    logs or venv. With ``source`` (a built checkout, such as the session's smoke run): the whole tree, results,
    figures, logs and Snakemake's records included, file times kept (Snakemake compares them), so that a test
    edits its own copy and never a checkout other tests share.
    """
    if source is not None:
        shutil.copytree(source, dest, symlinks=True)
        return dest
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@dataclass(frozen=True)
class ParsedRule:
    """What the tests read of one rule of the parsed workflow."""

    name: str
    outputs: tuple[str, ...]  # output patterns, wildcards as written in the rule ("{L}"), constraints dropped
    params: dict  # name → value as the rule declares it (config Settings, code fingerprints, callables)
    resources: dict  # name → value (callables for resources that depend on wildcards)
    script: Path | None  # the rule's script, absolute
    local: bool  # declared in ``localrules:``: runs on the machine that runs Snakemake, never through a cluster queue


def _plain_pattern(pattern: str) -> str:
    """``results/x/L{L,\\d+}.parquet`` → ``results/x/L{L}.parquet``."""
    out, depth, skipping = [], 0, False
    for ch in pattern:
        if ch == "{":
            depth += 1
            skipping = False
        elif ch == "}":
            depth -= 1
            skipping = False
        elif ch == "," and depth == 1:
            skipping = True
        if not skipping:
            out.append(ch)
    return "".join(out)


@functools.cache
def workflow_rules(config: tuple[tuple[str, object], ...] = ()) -> dict[str, ParsedRule]:
    """The rules of REPO's Snakefile as Snakemake parses them (config/config.yaml, then the top-level ``config``
    overrides given as (key, value) pairs), by name.

    Parsing runs the Snakefile in this process: the working directory and the environment variables it sets
    (LARGEPROMPT_PRODUCERS, SNAKEMAKE_OUTPUT_CACHE) are put back afterwards.
    """
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        with SnakemakeApi(OutputSettings()) as api:
            workflow_api = api.workflow(ResourceSettings(), ConfigSettings(config=dict(config)), snakefile=REPO / "Snakefile",
                                        workdir=REPO)
            # The one place the tests reach the parsed rules: Snakemake's API has no public accessor for them
            # (WorkflowApi._workflow is the parsed Workflow that list_rules() prints; Workflow._localrules holds the
            # names declared in `localrules:`, which Workflow.is_local() ignores when no executor is set).
            workflow = workflow_api._workflow
            local = set(workflow._localrules)
            rules = {}
            for rule in workflow.rules:
                script = Path(rule.basedir.get_path_or_uri(secret_free=True)) / rule.script if rule.script else None
                rules[rule.name] = ParsedRule(
                    name=rule.name,
                    outputs=tuple(_plain_pattern(str(f)) for f in rule.output),
                    params=dict(rule.params.items()),
                    resources=dict(rule.resources.items()),
                    script=script.resolve() if script else None,
                    local=rule.name in local,
                )
            return rules
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def theta(rows: pd.DataFrame) -> np.ndarray:
    """The weights of trajectory rows, [rows, P]: column ``theta`` holds one list per row (largeprompt.icl.models.flatten order)."""
    return np.stack([np.asarray(w, dtype=float) for w in rows["theta"]]) if len(rows) else np.empty((0, 0))


@contextlib.contextmanager
def without_compiler(monkeypatch, tmp_path, library):
    """A native kernel's cached loader ``library`` (largeprompt.icl.engine.native_step.library,
    largeprompt.kernel.native_moments.library) called with no C compiler and
    an empty cache: yields (what it returned, the warnings it gave); its cache is cleared before and after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    library.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = library()
        yield loaded, caught
    finally:
        library.cache_clear()
