from largeprompt.io.runlog import run_stage
from largeprompt.plots.gradient_concentration import plot_gradient_concentration

run_stage(snakemake, plot_gradient_concentration)  # noqa: F821 (injected by Snakemake)
