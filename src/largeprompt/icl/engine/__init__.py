"""The training engine of the §6 model (docs/experiments.md#training-protocol), in nine rooms, each importing only
the ones listed before it (tests/test_layers.py checks the order):

``native_step`` the native readout and SGD step (``stacked_readout.c``, compiled once per machine): the accelerated
              twin of :mod:`largeprompt.icl.tilted_readout` and :func:`largeprompt.icl.models.sgd_update`;
``stacked``   the stacked maths: R runs' forward pass, analytic gradients and SGD step on one shared batch;
``tuning``    the step's plan on this machine (prompts per block, exp or exp2, torch or native), tuned once and cached;
``runs``      a run's pieces: its spec, initial weights, batch stream, test losses and logged row;
``loop``      the per-L loop: every run of one prompt length stepped, logged, stopped on divergence, checkpointed;
``protocol``  the protocol: settings, step sizes from each run's own flow, the transfer section, one call per L;
``status``    the status rule that reads the finished runs (ok, unconverged, trapped, diverged);
``run_log``   the job's log lines (plumbing: never in a code fingerprint);
``job``       one training job: its runs trained, logged and written with provenance (every training rule's body).
"""
