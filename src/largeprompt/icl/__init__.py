"""In-context linear regression with the §6 model (R4–R6): the task, its closed-form risks, the model and its
SGD engine, the gradient flows and what the runs' outcomes are called.

``task``, ``risks``, ``full_model_risk`` (R∞ with exact derivatives), ``models``, ``multirun`` (stacked runs,
analytic backward), ``schedules`` (step sizes), ``training`` and ``trainer`` (the per-L loop with checkpoints),
``dynamics`` (gradient flows), ``flow_class`` and ``run_status``. May import :mod:`largeprompt.core` and
:mod:`largeprompt.maths`.
"""
