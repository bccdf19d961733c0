"""The hot loops: softmax-weighted moments of a long stream of tokens with their per-machine tuning, and the
training step's native readout.

``tilted_moments`` (the hot loop, a given kernel), ``autotune`` (the machine's kernel: tile, storage order,
base of the exponential; :class:`largeprompt.kernel.autotune.TunedMoments`), ``kernel_cache`` (the cache
file) and ``native`` (``stacked_readout.c``, compiled once per machine). May import :mod:`largeprompt.core` only.
"""
