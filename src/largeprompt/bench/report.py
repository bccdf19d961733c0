"""What every benchmark shares: the report line, targets, CPU-time medians, peak RSS and worker subprocesses."""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from largeprompt.kernel.kernel_cache import cpu_model


def line(label: str, value: float, unit: str, ref_label: str, ref: float, ratio: float, target: str | None) -> str:
    """One bench line: the measured value, the reference measured in the same run, their ratio and the target."""
    verdict = "(no target)" if target is None else f"(target {target}) {'ok' if eval_target(ratio, target) else 'MISSED'}"
    return f"{label:<44} {value:>10.3g} {unit:<12} | {ref_label:<28} {ref:>10.3g} | ratio {ratio:6.2f} {verdict}"


def eval_target(ratio: float, target: str) -> bool:
    """Whether ``ratio`` meets ``target``, written ">=0.5" or "<=2.0"."""
    op, bound = target[:2], float(target[2:])
    if op not in (">=", "<="):
        raise ValueError(f"target {target!r}: write '>=x' or '<=x'")
    return ratio >= bound if op == ">=" else ratio <= bound


def interleaved_seconds(fns: dict[str, Callable], repeats: int, warmup: int = 2) -> dict[str, dict[str, float]]:
    """Median CPU and wall seconds of each call, the calls taken in turns so that a burst of load hits all alike.

    CPU time (time.process_time) leaves out the time other processes hold the core; on a shared machine it is
    the number to compare, wall time is reported for reference.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    cpu, wall = ({name: [] for name in fns} for _ in range(2))
    for _ in range(repeats):
        for name, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append(time.process_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    return {"cpu": {n: statistics.median(t) for n, t in cpu.items()},
            "wall": {n: statistics.median(t) for n, t in wall.items()}}


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        for row in fh:
            if row.startswith(field + ":"):
                return int(row.split()[1]) / 1024
    raise KeyError(field)


def reset_peak_rss() -> float:
    """Reset the kernel's peak-RSS mark (Linux ≥ 4.0) and return the current RSS in MB."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return _status_mb("VmRSS")
    except OSError:  # not Linux: fall back to the lifetime peak
        return peak_rss_mb()


def peak_rss_mb() -> float:
    """This process's peak resident set (MB) since start or the last :func:`reset_peak_rss`."""
    try:
        return _status_mb("VmHWM")
    except (OSError, KeyError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_worker(name: str, prompt_length=0, dim=6, n_queries=64, repeats=5, timeout=3600, **extra) -> dict:
    """Run benchmark worker ``name`` in a fresh ``python -m largeprompt.bench --worker`` process; its JSON result."""
    cmd = [
        sys.executable, "-m", "largeprompt.bench", "--worker", name, "--prompt-length", str(prompt_length),
        "--dim", str(dim), "--queries", str(n_queries), "--repeats", str(repeats), "--extra", json.dumps(extra),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine_description() -> str:
    """'<CPU model>, <N> CPUs, <RAM> GiB' (RAM from /proc/meminfo where there is one)."""
    try:
        kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
        return f"{cpu_model()}, {os.cpu_count()} CPUs, {kib / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        return f"{cpu_model()}, {os.cpu_count()} CPUs"
