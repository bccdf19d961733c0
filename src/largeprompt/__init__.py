"""largeprompt: the figure pipeline for "Softmax as Linear Attention in the Large-Prompt Regime" (Boursier & Boyer).

Layers, each importing only those above it in this list (docs/architecture.md#layers):

* :mod:`largeprompt.core`: devices and random streams;
* :mod:`largeprompt.kernel`: the attention kernel and its tuning;
* :mod:`largeprompt.maths`: token measures, finite and infinite attention, their statistics;
* :mod:`largeprompt.icl`: the §6 in-context regression model, its SGD engine and flows;
* :mod:`largeprompt.io`: Parquet, provenance, logs and the pipeline's bookkeeping;
* :mod:`largeprompt.stages`: one module per Snakemake rule; :mod:`largeprompt.plots`: one per figure;
* :mod:`largeprompt.bench`, :mod:`largeprompt.commands.cli`, :mod:`largeprompt.commands.report`: the tools around them.
"""
