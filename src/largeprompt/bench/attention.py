"""Streaming finite-prompt attention against the two-pass BLAS floor and torch SDPA: throughput and peak memory."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from largeprompt.bench.report import interleaved_seconds, line, peak_rss_mb, reset_peak_rss, run_worker
from largeprompt.kernel.autotune import describe_kernels, kernels_report
from largeprompt.maths.attention import finite_prompt_attention, streaming_prompt_attention
from largeprompt.maths.measures import Gaussian

MEMORY_WORKERS = ("stream_memory", "sdpa_memory")


def _inputs(prompt_length: int, dim: int, n_queries: int):
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randn(prompt_length, dim, generator=gen, dtype=torch.float64)  # [L, D]
    query = torch.randn(n_queries, dim, generator=gen, dtype=torch.float64)  # [Q, D]
    U = 0.3 * torch.eye(dim, dtype=torch.float64)
    V = torch.eye(dim, dtype=torch.float64)
    return tokens, query, U, V


def _throughput_fn(name: str, tokens, query, U, V, extra: dict):
    """The timed call of throughput worker ``name``: our attention, the two-pass BLAS floor or torch SDPA."""
    (prompt_length, dim), n_queries = tokens.shape, query.shape[0]
    if name == "attention":
        return lambda: finite_prompt_attention(query, tokens, U, V)
    if name == "floor":
        tilt = query @ U.T
        block = int(extra.get("block", 2048))

        def fn():  # two BLAS passes over the tokens: scores, then the score-weighted sum
            out = torch.zeros(n_queries, dim, dtype=torch.float64)
            for start in range(0, prompt_length, block):
                chunk = tokens[start : start + block]
                out += (tilt @ chunk.T) @ chunk
            return out

        return fn
    if name == "sdpa":
        q = (query @ U.T)[None, None]  # [1, 1, Q, D]
        kv = tokens[None, None]  # [1, 1, L, D]
        return lambda: F.scaled_dot_product_attention(q, kv, kv, scale=1.0) @ V.T
    raise ValueError(f"unknown benchmark worker {name!r}")


def _stream_memory(prompt_length: int, dim: int, n_queries: int) -> dict:

    measure = Gaussian(torch.zeros(dim), torch.eye(dim, dtype=torch.float64))
    query = torch.randn(n_queries, dim, dtype=torch.float64)
    U = 0.3 * torch.eye(dim, dtype=torch.float64)
    run = lambda L: streaming_prompt_attention(query, measure, L, U, U, torch.Generator().manual_seed(1))  # noqa: E731
    run(100_000)  # warm-up at a small L
    baseline = reset_peak_rss()
    start = time.perf_counter()
    run(prompt_length)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rss_mb": peak_rss_mb(), "baseline_rss_mb": baseline, **kernels_report()}


def _sdpa_memory(prompt_length: int, dim: int, n_queries: int) -> dict:
    """The same job as stream_memory, done the usual way: draw the prompt, then SDPA."""

    measure = Gaussian(torch.zeros(dim), torch.eye(dim, dtype=torch.float64))
    query = 0.3 * torch.randn(n_queries, dim, dtype=torch.float64)
    F.scaled_dot_product_attention(query[None, None], query[None, None], query[None, None], scale=1.0)  # warm-up
    baseline = reset_peak_rss()
    start = time.perf_counter()
    tokens = measure.sample(prompt_length, torch.Generator().manual_seed(1))[None, None]  # [1, 1, L, D]
    F.scaled_dot_product_attention(query[None, None], tokens, tokens, scale=1.0)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rss_mb": peak_rss_mb(), "baseline_rss_mb": baseline}


def worker(name: str, prompt_length: int, dim: int, n_queries: int, repeats: int, extra: dict) -> dict:
    """An attention worker: ``interleaved`` (attention, floor, SDPA in turns) or a peak-memory run."""

    if name == "stream_memory":
        return _stream_memory(prompt_length, dim, n_queries)
    if name == "sdpa_memory":
        return _sdpa_memory(prompt_length, dim, n_queries)
    if name != "interleaved":
        raise ValueError(f"unknown benchmark worker {name!r}")
    tokens, query, U, V = _inputs(prompt_length, dim, n_queries)
    fns = {kind: _throughput_fn(kind, tokens, query, U, V, extra) for kind in ("attention", "floor", "sdpa")}
    # the warm-up fixes the attention's kernel (tuned at first use, else from the per-machine cache)
    timed = interleaved_seconds(fns, repeats, warmup=1)
    return {"seconds": timed["wall"], "cpu_seconds": timed["cpu"], **kernels_report()}


def bench_attention(quick: bool) -> list[str]:
    """The attention lines: throughput against the floor and SDPA, and peak memory against draw-then-SDPA."""

    L = 200_000 if quick else 1_000_000
    D, Q, reps = 6, 64, 3 if quick else 7
    timed = run_worker("interleaved", L, D, Q, reps)  # one process, the three kernels in turns
    rate = {kind: L * Q / timed["cpu_seconds"][kind] for kind in ("attention", "floor", "sdpa")}
    ours = rate["attention"]
    wall = timed["seconds"]
    out = [
        f"# streaming finite-prompt attention, L={L:.0e}, D={D}, {Q} queries, float64, 1 thread, "
        f"median CPU time of {reps} interleaved rounds (wall: ours {wall['attention']:.3f} s, "
        f"floor {wall['floor']:.3f} s, SDPA {wall['sdpa']:.3f} s)",
        "  " + describe_kernels(timed, Q),  # the kernel the pipeline would use here: same per-machine cache
        line("attention throughput (tokens·queries/s)", ours, "tok·q/s", "two-pass BLAS floor", rate["floor"],
             ours / rate["floor"], ">=0.5"),
        line("attention throughput (tokens·queries/s)", ours, "tok·q/s", "torch SDPA", rate["sdpa"], ours / rate["sdpa"],
             ">=1.0"),
    ]
    return out + _memory_lines(D, Q)


def _memory_lines(D: int, Q: int) -> list[str]:
    L_mem = 10_000_000
    stream = run_worker("stream_memory", L_mem, D, Q, 1)
    drawn = run_worker("sdpa_memory", L_mem, D, Q, 1)
    mem = lambda r: r["rss_mb"] - r["baseline_rss_mb"]  # noqa: E731
    return [
        line(f"attention over a fresh prompt, L={L_mem:.0e}: peak RSS (MB)", mem(stream), "MB",
             "draw the prompt, then SDPA", mem(drawn), mem(stream) / mem(drawn), "<=0.25"),
        f"  (streaming L={L_mem:.0e} with sampling: {stream['seconds']:.2f} s, {L_mem * Q / stream['seconds']:.3g} tok·q/s; "
        f"draw + SDPA: {drawn['seconds']:.2f} s; the prompt alone is {L_mem * D * 8 / 2**20:.0f} MB)",
    ]
