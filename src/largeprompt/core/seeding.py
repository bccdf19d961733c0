"""Counter-based seeded generators ("any batch can be regenerated exactly",
docs/experiments.md#seeds-and-streams).

Every random stream is keyed by (base seed, stream name, integer counters such as the
repetition, the seed or the training step). ``numpy.random.SeedSequence`` hashes the key into
a 64-bit seed for a fresh ``torch.Generator`` (:func:`stream_generator`) or numpy ``Generator``
(:func:`stream_rng`), so stream k never depends on how many numbers stream k−1 drew, and a job can regenerate
step s without replaying steps 0…s−1.

Normal draws (:func:`standard_normal`, docs/theory.md#token-sampler): from a numpy Generator by its ziggurat in
float64, whose law is N(0, 1) to double precision with untruncated tails (3 to 5 times faster than torch's float64
``randn`` on a CPU); from a torch Generator by ``torch.randn`` in the requested dtype (in float32 a Box–Muller on
24-bit uniforms, which never draws beyond |z| = √(48 ln 2) ≈ 5.77).
"""
from __future__ import annotations

import collections
import math
import zlib

import numpy as np
import torch


def stream_seed(base_seed: int, stream: str, *counters: int) -> int:
    """A 63-bit seed for the stream (base_seed, stream, *counters)."""
    words = [int(base_seed), zlib.crc32(stream.encode())] + [int(c) for c in counters]
    if any(w < 0 for w in words):
        raise ValueError(f"seeds and counters must be non-negative; got {words}")
    state = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def stream_generator(base_seed: int, stream: str, *counters: int, device="cpu") -> torch.Generator:
    """A torch.Generator seeded for the stream (base_seed, stream, *counters)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(stream_seed(base_seed, stream, *counters))
    return gen


def stream_rng(base_seed: int, stream: str, *counters: int) -> np.random.Generator:
    """A numpy Generator (SFC64 bits) seeded for the stream (base_seed, stream, *counters)."""
    return np.random.Generator(np.random.SFC64(stream_seed(base_seed, stream, *counters)))


DRAWN: collections.Counter = collections.Counter()  # sampler → how many numbers this process drew (bench floors)


def sampler(kind: str, generator, dtype) -> str:
    """The name under which a draw is counted in DRAWN: '<kind>/<numpy|torch>/<dtype drawn>'."""
    if isinstance(generator, np.random.Generator):
        return f"{kind}/numpy/{'int64' if kind == 'bits' else 'float64'}"
    return f"{kind}/torch/{'int64' if kind == 'bits' else str(dtype).removeprefix('torch.')}"


def standard_normal(shape, generator, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """i.i.d. N(0, 1) of ``shape`` (module docstring): numpy's ziggurat in float64 for a numpy Generator (then cast),
    ``torch.randn`` for a torch Generator or None."""
    DRAWN[sampler("normal", generator, dtype)] += math.prod(shape)
    if isinstance(generator, np.random.Generator):
        return torch.from_numpy(generator.standard_normal(tuple(shape))).to(dtype=dtype, device=device)
    return torch.randn(*shape, generator=generator, dtype=dtype, device=device)


def uniform(shape, generator, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """i.i.d. U[0, 1) of ``shape``, from a numpy or torch Generator."""
    DRAWN[sampler("uniform", generator, dtype)] += math.prod(shape)
    if isinstance(generator, np.random.Generator):
        return torch.from_numpy(generator.random(tuple(shape))).to(dtype=dtype, device=device)
    return torch.rand(*shape, generator=generator, dtype=dtype, device=device)


def random_bits(shape, generator, device="cpu") -> torch.Tensor:
    """i.i.d. fair bits {0, 1} of ``shape`` (int64), from a numpy or torch Generator."""
    DRAWN[sampler("bits", generator, None)] += math.prod(shape)
    if isinstance(generator, np.random.Generator):
        return torch.from_numpy(generator.integers(0, 2, size=tuple(shape))).to(device=device)
    return torch.randint(0, 2, tuple(shape), generator=generator, device=device)


def draw(name: str, n: int, generator):
    """``n`` numbers of sampler ``name`` (a DRAWN key) from ``generator`` (a numpy or torch Generator of that
    library): what ``largeprompt bench`` times for the sampler's rate."""
    kind, _, dtype = name.split("/")
    if kind == "bits":
        return random_bits((n,), generator)
    fn = standard_normal if kind == "normal" else uniform
    return fn((n,), generator, dtype=getattr(torch, dtype))
