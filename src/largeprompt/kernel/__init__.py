"""The hot loop: softmax-weighted moments of a long stream of tokens with its per-machine tuning, and the helpers
that build native code (the training step's own C lives with the engine, :mod:`largeprompt.icl.engine.native_step`).

``tilted_moments`` (the hot loop, a given kernel), ``autotune`` (the machine's kernel: tile, storage order,
base of the exponential; :class:`largeprompt.kernel.autotune.TunedMoments`), ``kernel_cache`` (the cache
file), ``native_moments`` (``tilted_moments.c``) and ``native_build`` (compiling a package's C once per machine, with
the shared ``vector_math.h`` in front). May import :mod:`largeprompt.core` only.
"""
