from largeprompt.plots.gradient_concentration import plot_gradient_concentration
from largeprompt.runlog import run_stage

run_stage(snakemake, plot_gradient_concentration)  # noqa: F821 (injected by Snakemake)
