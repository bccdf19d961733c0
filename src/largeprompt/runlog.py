"""Logging, progress bars and thread control for pipeline stages (SPEC §3.1, §5).

A Snakemake script calls :func:`run_stage`; by hand, call the stage function directly.
"""
from __future__ import annotations

import contextlib
import sys
import time
import traceback
from typing import Callable, Iterable

import torch
from tqdm import tqdm

from .parquet_io import plain


@contextlib.contextmanager
def stage_log(log_path: str | None):
    """Send stdout, stderr (and so tqdm) to ``log_path``; log the traceback of a failure, then re-raise."""
    if log_path is None:
        yield sys.stderr
        return
    with open(log_path, "w", buffering=1) as log:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            start = time.perf_counter()
            try:
                yield log
            except BaseException:
                traceback.print_exc(file=log)
                raise
            print(f"done in {time.perf_counter() - start:.2f} s", file=log)


def progress(iterable: Iterable, desc: str, total: int | None = None):
    """A tqdm bar that writes plain ASCII lines suitable for a log file."""
    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, ascii=True, mininterval=2.0, dynamic_ncols=False, ncols=100)


def set_threads(threads: int) -> None:
    """Pin torch's intra-op threads so parallel jobs do not oversubscribe the cores."""
    torch.set_num_threads(max(1, int(threads)))


def keep_freed_memory() -> bool:
    """Ask glibc to recycle freed blocks instead of returning them to the OS (Linux only).

    The hot loops allocate same-sized batch tensors of a few MB every step; by default glibc
    serves each from a fresh mmap and pays the page faults again, which measured as ≈ 40% of a
    training step (SPEC §4). Raising M_MMAP_THRESHOLD and M_TRIM_THRESHOLD keeps them in the heap.
    Returns whether the settings took effect.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 256 << 20)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False


def resolve_device(name: str = "auto") -> torch.device:
    """The torch device for config value ``device`` (auto | cpu | cuda)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config key 'device' = \"cuda\" but torch sees no CUDA device; use 'auto' or 'cpu'")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"config key 'device' = {name!r}: allowed auto, cpu, cuda")
    return torch.device(name)


def run_stage(smk, stage: Callable) -> None:
    """Run ``stage(inputs=…, outputs=…, params=…, rule=…)`` from a Snakemake ``script:`` object."""
    params = plain(dict(smk.params.items()))
    with stage_log(smk.log[0] if smk.log else None):
        set_threads(smk.threads)
        keep_freed_memory()
        print(f"rule {smk.rule}: threads={smk.threads}, params={params}")
        stage(
            inputs=dict(smk.input.items()),
            outputs=dict(smk.output.items()),
            params=params,
            rule=smk.rule,
        )
