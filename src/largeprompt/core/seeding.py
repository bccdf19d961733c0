"""Counter-based seeded generators ("any batch can be regenerated exactly",
docs/experiments.md#seeds-and-streams).

Every random stream is keyed by (base seed, stream name, integer counters such as the
repetition, the seed or the training step). ``numpy.random.SeedSequence`` hashes the key into
a 64-bit seed for a fresh ``torch.Generator``, so stream k never depends on how many numbers
stream k−1 drew, and a job can regenerate step s without replaying steps 0…s−1.
"""
from __future__ import annotations

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
