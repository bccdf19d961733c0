"""Whole-pipeline timings: from empty, a no-op rerun and a figure-only rerun, each in a fresh copy of the repository."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from largeprompt.bench.report import line
from largeprompt.io.config import check_config

REPO = Path(__file__).resolve().parents[3]
# what a fresh checkout does not have: version control, the virtualenv, every run's outputs (top level) and caches
NOT_SHIPPED_TOP = {".git", ".venv", "venv", ".snakemake", ".snakemake-cache", "results", "figures", "logs", "benchmarks",
                   "build", "report.html"}
NOT_SHIPPED = ("__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", "*.egg-info", ".ipynb_checkpoints")


def _not_shipped(root: Path):
    caches = shutil.ignore_patterns(*NOT_SHIPPED)

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = NOT_SHIPPED_TOP.intersection(names) if Path(folder) == root else set()
        return top | set(caches(folder, names))

    return ignore


def fresh_copy(repo: Path, dest: Path) -> Path:
    """Copy ``repo`` into ``dest`` without its results, figures, logs, caches, .git or virtualenv: an empty run."""
    shutil.copytree(repo, dest, ignore=_not_shipped(Path(repo)), symlinks=True)
    return dest


def checkout_env(work: Path, *first: Path) -> dict[str, str]:
    """This environment with ``first`` and the copy's src/ leading PYTHONPATH: its jobs run the copy's code."""
    path = [str(p) for p in first] + [str(work / "src"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))


def _snakemake(work: Path, *args, timeout=3600) -> float:
    """Wall seconds of one ``snakemake`` call in ``work`` (from this interpreter's environment)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=work, capture_output=True, text=True,
                          timeout=timeout, env=checkout_env(work))
    if proc.returncode != 0:
        raise RuntimeError(f"snakemake {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def bench_pipeline(configfile: str | None) -> list[str]:
    """Default (or ``configfile``) pipeline from empty ≤ 10 min, no-op rerun ≤ 5 s, figure-only rerun ≤ 15 s (wall)."""
    extra = ["--configfile", configfile] if configfile else []
    label = configfile or "config/config.yaml (default)"
    with tempfile.TemporaryDirectory() as tmp:
        work = fresh_copy(REPO, Path(tmp) / "repo")
        full = _snakemake(work, "--cores", "2", *extra)
        noop = _snakemake(work, "--cores", "2", *extra)
        module = work / "src" / "largeprompt" / "plots" / "affine_limit.py"
        module.write_text(module.read_text() + "\npass  # an edit the figure's code reaches (a new unused name would rerun nothing)\n")
        redraw = _snakemake(work, "--cores", "2", *extra)
    limit = 600.0
    return [
        f"# whole pipeline, snakemake --cores 2, {label}, wall time (run it on a quiet machine)",
        line("from empty (s)", full, "s", "budget (s)", limit, full / limit, "<=1.0"),
        line("no-op rerun (s)", noop, "s", "budget (s)", 5.0, noop / 5.0, "<=1.0"),
        line("figure-only rerun after a plot edit (s)", redraw, "s", "budget (s)", 15.0, redraw / 15.0, "<=1.0"),
    ]


def deep_merge(base: dict, overlay: dict) -> dict:
    """``overlay`` merged into a copy of ``base``, mappings key by key (as Snakemake merges --configfile overlays)."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def paper_config(repo: Path = REPO, overlay: str = "config/paper.yaml") -> dict:
    """config/config.yaml with ``overlay`` merged over it, numbers read as numbers and checked by the schema."""
    base, extra = (yaml.safe_load((repo / name).read_text()) for name in ("config/config.yaml", overlay))
    config = deep_merge(base, extra)
    check_config(config, repo / "workflow" / "schemas" / "config.schema.yaml")
    return config
