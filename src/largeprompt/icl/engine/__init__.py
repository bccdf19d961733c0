"""The training engine of the §6 model (docs/experiments.md#training-protocol), in six rooms, each importing only
the ones listed before it:

``stacked``   the stacked maths: R runs' forward pass, analytic gradients and SGD step on one shared batch;
``tuning``    the step's plan on this machine (prompts per block, exp or exp2), tuned once and cached;
``runs``      a run's pieces: its spec, initial weights, batch stream, test losses and logged row;
``loop``      the per-L loop: every run of one prompt length stepped, logged, stopped on divergence, checkpointed;
``protocol``  the protocol: settings, step sizes from each run's own flow, the transfer section, one call per L;
``status``    the status rule that reads the finished runs (ok, unconverged, trapped, diverged).
"""
