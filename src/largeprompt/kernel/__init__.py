"""The attention kernel: softmax-weighted moments of a long stream of tokens, and its per-machine tuning.

``tilted_moments`` (the hot loop, a given kernel), ``autotune`` (the machine's kernel: tile, storage order,
base of the exponential; :class:`largeprompt.kernel.autotune.TunedMoments`) and ``kernel_cache`` (the cache
file). May import :mod:`largeprompt.core` only.
"""
