"""The maths of finite and infinite attention over a token measure (R1–R3) and the statistics the figures report.

``measures`` (token measures and their cumulant generating functions), ``attention`` (finite-prompt,
streaming and infinite-prompt attention), ``fluctuations`` (fixed-query limit law, bias and bound), ``fixed_query`` (its experiment's rows),
``gradients`` (Jacobians in U and V), ``rates`` (log-log fits, bootstrap, intervals) and ``classifiers``
(cross-validated predictors, Wilson intervals). May import :mod:`largeprompt.core` and :mod:`largeprompt.kernel`.
"""
