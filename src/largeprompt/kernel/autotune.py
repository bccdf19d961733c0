"""Per-machine choice of the streaming-attention kernel (:class:`largeprompt.kernel.tilted_moments.AttentionKernel`).

The hot loop of :class:`largeprompt.kernel.tilted_moments.TiltedMoments` (GEMM → exp → GEMM over a tile of
scores) has three knobs whose best setting depends on the machine: the tile size (per-tile Python
overhead against cache misses: the cache hierarchy), the storage order of scores and sums (which
GEMM shapes the BLAS runs fastest) and the base of the exponential (torch's exp2 is 1.7× slower than
exp on an Intel Xeon with MKL, 1.9× faster on an AMD EPYC, where MKL's exp is slow). They are fixed
once per machine and regime (queries per prompt, prompts per batch, D, dtype), at first use:

1. ``LARGEPROMPT_ATTENTION_KERNEL=tile=<n>,scores=token|query,exp=e|2`` (any subset of the fields)
   in the environment wins, and nothing is tuned;
2. else the cache ``$XDG_CACHE_HOME/largeprompt/attention_kernels.json`` (``~/.cache/largeprompt``);
3. else every combination of a few tiles, sized from the detected L2 and L3 caches, both storage
   orders and both bases is timed on a synthetic problem of the same regime (well under a second)
   under an exclusive file lock, and the winner is written to the cache atomically. A job that finds
   the lock held waits and re-reads, so concurrent jobs agree: the first writer wins. A corrupt
   cache is ignored and rewritten.

The cache is keyed by CPU model, core count, torch threads and version and the kernel's revision,
then by regime. The kernel changes only the order and rounding of floating-point operations, so
results agree to round-off for every choice; a rerun is bit-identical with the same kernel, which the
cache keeps fixed across runs and the provenance of every Parquet file records
(``attention_kernels``, :func:`kernels_used`; set the variable to a recorded value to run that kernel).
Deleting the cache may retune to another kernel: same results up to round-off, not the same bits.
Streaming chunk sizes are not tuned: a streamed prompt's chunk size fixes its random stream
(:func:`largeprompt.maths.attention.prompt_chunks`), so it is a config value.
"""
from __future__ import annotations

import math
import os
import time
import warnings
from pathlib import Path

import torch

from largeprompt.kernel import native_moments
from largeprompt.kernel.kernel_cache import cache_file, cached_or_tuned, cpu_model
from largeprompt.kernel.tilted_moments import AttentionKernel, TiltedMoments

ENV_KERNEL = "LARGEPROMPT_ATTENTION_KERNEL"
KERNEL_REVISION = 5  # bump when TiltedMoments' hot loop changes: kernels tuned for an older loop are then retuned
DEFAULT_TILE_ELEMENTS = 1 << 20  # devices other than the CPU: not tuned
TOKEN_MAJOR_MIN_QUERIES = 16  # the untuned default storage order: token-major from this many queries per prompt
MAX_TILE_ELEMENTS = 1 << 21
TUNING_TOKEN_BYTES = 32 << 20  # memory for the synthetic prompt of a tuning run
FALLBACK_CACHES = {2: 512 << 10, 3: 8 << 20}  # bytes, where /sys does not say

_chosen: dict[str, AttentionKernel] = {}  # regime key → the kernel used by this process
_sources: dict[str, str] = {}  # regime key → "env" | "cache" | "tuned" | "default"


def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[int, int]:
    """Data/unified cache size in bytes per level {1: …, 2: …, 3: …} of cpu0; FALLBACK_CACHES if unknown."""
    sizes = {}
    for index in sorted(Path(root).glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level, size = int((index / "level").read_text()), (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
        digits = size.rstrip("KMGkmg")
        if digits.isdigit():
            sizes[level] = int(digits) * scale
    return {**FALLBACK_CACHES, **sizes}


def machine_key() -> str:
    """CPU model, core count, torch threads and version, and the kernel's revision."""
    return (f"{cpu_model()} | {os.cpu_count()} cores | {torch.get_num_threads()} threads | torch {torch.__version__}"
            f" | kernel {KERNEL_REVISION}")


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def regime_key(queries: int, prompts: int, dim: int, second_moment: bool, dtype: torch.dtype, device="cpu") -> str:
    """'attention/<dtype>/<device>/D<dim>/q<queries bucket>/p<prompts bucket>[/cov]': counts round up to powers of 2."""
    dtype_name = str(dtype).removeprefix("torch.")
    key = f"attention/{dtype_name}/{torch.device(device).type}/D{dim}/q{_pow2_at_least(queries)}/p{_pow2_at_least(prompts)}"
    return key + ("/cov" if second_moment else "")


def candidate_tiles(queries: int, prompts: int, dim: int, itemsize: int, caches: dict[int, int] | None = None) -> list[int]:
    """Powers of two of score elements whose working set (scores + their tokens) spans L2 … L3/2.

    A score costs ``itemsize`` bytes and its share of the token tile (D + 1)·itemsize / queries.
    Sizes that give the same tile in tokens (at least TiltedMoments.MIN_TILE_TOKENS) are merged.
    """
    caches = caches or cache_sizes()
    per_element = itemsize * (1 + (dim + 1) / queries)
    low = max(1, int(caches[2] / per_element))
    high = min(MAX_TILE_ELEMENTS, max(low, int(caches[3] / 2 / per_element)))
    tiles, seen = [], set()
    for k in range(low.bit_length() - 1, high.bit_length()):
        tokens = max(TiltedMoments.MIN_TILE_TOKENS, (1 << k) // (queries * prompts))
        if tokens not in seen:
            seen.add(tokens)
            tiles.append(1 << k)
    return tiles


def default_kernel(queries: int, tile_elements: int = DEFAULT_TILE_ELEMENTS) -> AttentionKernel:
    """The untuned kernel: base e, token-major from TOKEN_MAJOR_MIN_QUERIES queries per prompt."""
    return AttentionKernel(int(tile_elements), queries >= TOKEN_MAJOR_MIN_QUERIES, False)


def candidate_kernels(queries: int, prompts: int, dim: int, itemsize: int, caches=None) -> list[AttentionKernel]:
    """Every candidate tile (:func:`candidate_tiles`) in both storage orders and both bases, and the native loop
    (:mod:`largeprompt.kernel.native_moments`) where it is built and takes this D and dtype."""
    tiles = candidate_tiles(queries, prompts, dim, itemsize, caches)
    kernels = [AttentionKernel(tile, token_major, base2) for tile in tiles for token_major in (False, True)
               for base2 in (False, True)]
    if native_moments.library() is not None and 1 <= dim <= native_moments.MAX_DIM and itemsize in (4, 8):
        kernels.append(AttentionKernel(tiles[0], False, True, native=True))
    return kernels


def time_candidates(kernels, queries, prompts, dim, second_moment, dtype, rounds: int = 3) -> dict[AttentionKernel, float]:
    """Best-of-``rounds`` CPU seconds of one TiltedMoments.update per kernel, on the same synthetic prompt.

    CPU time (this process's) leaves out the time other jobs hold the core, and rounds interleave the
    candidates, so a burst of load on a shared machine does not pick the kernel.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    tile_tokens = {k: max(TiltedMoments.MIN_TILE_TOKENS, k.tile_elements // (queries * prompts)) for k in kernels}
    budget = max(1, TUNING_TOKEN_BYTES // (prompts * dim * itemsize))
    n_tokens = min(budget, 2 * max(tile_tokens.values()))
    kernels = [k for k in kernels if 2 * tile_tokens[k] <= n_tokens] or [min(kernels, key=lambda k: k.tile_elements)]
    gen = torch.Generator().manual_seed(0)
    tilt = 0.5 * torch.randn(prompts, queries, dim, generator=gen, dtype=dtype)
    tokens = torch.randn(prompts, n_tokens, dim, generator=gen, dtype=dtype)
    if prompts == 1:
        tilt, tokens = tilt[0], tokens[0]  # one prompt shared by the queries

    def run(kernel: AttentionKernel) -> float:
        acc = TiltedMoments(tilt, second_moment, kernel)
        acc.update(tokens[..., :1, :])  # the first tile sets the reference: time the steady state
        start = time.process_time()
        acc.update(tokens)
        return time.process_time() - start

    best = {k: math.inf for k in kernels}
    for _ in range(rounds):
        for kernel in kernels:
            best[kernel] = min(best[kernel], run(kernel))
    return best


def _parse_cached(text: str) -> AttentionKernel | None:
    try:
        return AttentionKernel.parse(text, default_kernel(1))
    except ValueError:
        return None


def _kernel_from_cache_or_tuning(queries, prompts, dim, second_moment, dtype, regime) -> tuple[AttentionKernel, str]:
    return cached_or_tuned(machine_key(), regime, "kernel", _parse_cached,
                           lambda: tune(queries, prompts, dim, second_moment, dtype))


def tune(queries, prompts, dim, second_moment, dtype) -> tuple[AttentionKernel, dict[AttentionKernel, float]]:
    """The fastest candidate kernel and every candidate's best time (s), timed at the regime's bucket sizes."""
    queries, prompts = _pow2_at_least(queries), _pow2_at_least(prompts)
    itemsize = torch.empty((), dtype=dtype).element_size()
    kernels = candidate_kernels(queries, prompts, dim, itemsize)
    seconds = time_candidates(kernels, queries, prompts, dim, second_moment, dtype)
    return min(seconds, key=seconds.get), seconds


def env_kernel(queries: int) -> AttentionKernel | None:
    """The override LARGEPROMPT_ATTENTION_KERNEL (fields it leaves out: :func:`default_kernel`), or None if unset."""
    raw = os.environ.get(ENV_KERNEL, "").strip()
    if not raw:
        return None
    try:
        return AttentionKernel.parse(raw, default_kernel(queries))
    except ValueError as exc:
        raise ValueError(f"{ENV_KERNEL}={raw!r}: {exc}") from None


def attention_kernel(queries: int, prompts: int, dim: int, second_moment: bool = False,
                     dtype: torch.dtype = torch.float64, device="cpu") -> AttentionKernel:
    """The kernel for ``prompts`` prompts of dimension ``dim`` with ``queries`` queries each.

    The environment override, else this process's earlier choice, else the per-machine cache,
    else tuning (CPU only; other devices get :func:`default_kernel`). Recorded for :func:`kernels_used`.
    """
    regime = regime_key(queries, prompts, dim, second_moment, dtype, device)
    override = env_kernel(queries)
    if override is not None:
        kernel, source = override, "env"
    elif regime in _chosen:
        return _chosen[regime]
    elif torch.device(device).type != "cpu":
        kernel, source = default_kernel(queries), "default"
    else:
        try:
            kernel, source = _kernel_from_cache_or_tuning(queries, prompts, dim, second_moment, dtype, regime)
        except OSError as exc:  # unwritable cache folder: tune for this process only
            warnings.warn(f"attention kernel cache {cache_file()} unusable ({exc}); tuning without caching", stacklevel=2)
            kernel, source = tune(queries, prompts, dim, second_moment, dtype)[0], "tuned"
    _chosen[regime], _sources[regime] = kernel, source
    return kernel


def recorded(regime: str):
    """This process's choice for ``regime`` (any tuned choice recorded here), or None."""
    return _chosen.get(regime)


def record(regime: str, choice, source: str) -> None:
    """Record another tuned choice of this process (the training engine's plan,
    :mod:`largeprompt.icl.engine.tuning`) with the attention kernels, for :func:`kernels_used`."""
    _chosen[regime], _sources[regime] = choice, source


def kernels_used() -> dict[str, str]:
    """{regime key: kernel} of every attention regime this process has run (for provenance)."""
    return {regime: str(kernel) for regime, kernel in sorted(_chosen.items())}


def kernel_sources() -> dict[str, str]:
    """{regime key: 'env' | 'cache' | 'tuned' | 'default'}: where each choice of this process came from."""
    return dict(sorted(_sources.items()))


def forget() -> None:
    """Drop this process's choices (tests; a new cache or override is then read at next use)."""
    _chosen.clear()
    _sources.clear()


def kernels_report() -> dict:
    """{'kernels': …, 'kernel_sources': …} of this process, JSON-ready (the bench workers print it)."""
    return {"kernels": kernels_used(), "kernel_sources": kernel_sources()}


def describe_kernels(report: dict, queries: int) -> str:
    """One informational line for a :func:`kernels_report`, with the tile in tokens at ``queries`` queries per prompt."""
    parts = []
    for key, text in report.get("kernels", {}).items():
        if not key.startswith("attention/"):
            continue
        kernel = AttentionKernel.parse(text, default_kernel(queries))
        tokens = max(TiltedMoments.MIN_TILE_TOKENS, kernel.tile_elements // queries)
        size = "the native loop's own chunks" if kernel.native else f"{tokens} tokens"
        parts.append(f"{key}: {text} ({size}; {report['kernel_sources'].get(key, '?')})")
    return f"(attention kernel {'; '.join(parts) or 'not used'}; cache {cache_file()}; override {ENV_KERNEL})"


class TunedMoments(TiltedMoments):
    """:class:`TiltedMoments` with the machine's kernel (:func:`attention_kernel`) unless one is given."""

    def choose_kernel(self, queries: int, prompts: int, dim: int, dtype, device) -> AttentionKernel:
        return attention_kernel(queries, prompts, dim, self.second_moment, dtype, device)
