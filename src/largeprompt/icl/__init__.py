"""In-context linear regression with the §6 model (R4–R6): the task, its closed-form risks, the model and its
SGD engine, the gradient flows and what the runs' outcomes are called.

``task``, ``risks``, ``full_model_risk`` (R∞ with exact derivatives), ``models``, ``schedules`` (step sizes),
``engine`` (stacked runs with their analytic backward, the per-L loop with checkpoints, the protocol and the
status rule), ``dynamics`` (gradient flows) and ``flow_class``. May import :mod:`largeprompt.core` and
:mod:`largeprompt.maths`.
"""
