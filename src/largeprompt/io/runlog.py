"""Logging, progress bars and thread control for pipeline stages (README.md, "The pipeline").

A Snakemake script calls :func:`run_stage`; by hand, call the stage function directly.
"""
from __future__ import annotations

import contextlib
import ctypes
import inspect
import sys
import time
import traceback
from collections.abc import Callable, Iterable

from tqdm import tqdm

from largeprompt.io import figure_provenance
from largeprompt.io.parquet_io import ResultFileError, plain
from largeprompt.io.pipeline import STATUS_RULE_KEYS, Runtime, stage_params


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


def progress(iterable: Iterable | None, desc: str, total: int | None = None, **kwargs):
    """A tqdm bar that writes plain ASCII lines suitable for a log file (``iterable`` None: update it by hand)."""
    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, ascii=True, mininterval=2.0, dynamic_ncols=False,
                ncols=100, **kwargs)


def set_threads(threads: int) -> None:
    """Pin torch's intra-op threads so parallel jobs do not oversubscribe the cores. Only where the stage uses torch
    (it is imported by then): a figure job does not pay the two seconds of importing it."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(max(1, int(threads)))


def keep_freed_memory() -> bool:
    """Ask glibc to recycle freed blocks instead of returning them to the OS (Linux only).

    The hot loops allocate same-sized batch tensors of a few MB every step; by default glibc
    serves each from a fresh mmap and pays the page faults again, which measured as ≈ 40% of a
    training step (README.md, "Performance"). Raising M_MMAP_THRESHOLD and M_TRIM_THRESHOLD keeps them in the heap.
    Returns whether the settings took effect.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 256 << 20)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False


# their checkpoint cadence is trajectory_transfer.checkpoint_every
TRANSFER_RULES = ("train_trajectory_transfer", "train_trajectory_transfer_beyond_gaussian")


def runtime_settings(smk) -> Runtime:
    """The job settings that cannot change a result, read from the config at run time (never params). The
    checkpoint cadence is ``trajectory_transfer.checkpoint_every`` for the R4 transfer jobs (a few hundred long steps), else
    ``train.checkpoint_every``."""
    config = smk.config
    train = config.get("train", {})
    rule = {k: train[k] for k in STATUS_RULE_KEYS if k in train}
    section = config.get("trajectory_transfer", {}) if getattr(smk, "rule", None) in TRANSFER_RULES else train
    return Runtime(
        device=str(config.get("device", "auto")),
        threads=int(smk.threads),
        checkpoint_every=int(section.get("checkpoint_every", 0)),
        status_rule=rule or None,
    )


def run_stage(smk, stage: Callable) -> None:
    """Run ``stage(inputs=…, outputs=…, params=…, rule=…[, runtime=…])`` from a Snakemake ``script:`` object.

    A missing or unreadable input ends the job with one line naming the file, the rule that makes it
    and the command that rebuilds it (no traceback).
    """
    params = plain(stage_params(dict(smk.params.items())))
    inputs = dict(smk.input.items())
    runtime = runtime_settings(smk)
    kwargs = {"runtime": runtime} if "runtime" in inspect.signature(stage).parameters else {}
    with stage_log(smk.log[0] if smk.log else None):
        set_threads(runtime.threads)
        keep_freed_memory()
        print(f"rule {smk.rule}: {runtime}")
        print("params: " + ", ".join(f"{k}={v!r}" for k, v in sorted(params.items()) if k != "code"))
        print("code: " + ", ".join(f"{k}={v}" for k, v in sorted(params.get("code", {}).items())))
        outputs = dict(smk.output.items())
        figures = [p for p in outputs.values() if str(p).endswith((".png", ".pdf"))]
        figure_provenance.set_current(figure_provenance.figure_record(smk.rule, params, list(smk.input), figures[0])
                                      if figures else None)
        try:
            stage(inputs=inputs, outputs=outputs, params=params, rule=smk.rule, **kwargs)
        except ResultFileError as err:
            print(f"error: {err}", file=sys.__stderr__)
            print(f"error: {err}")
            raise SystemExit(1) from None
