from largeprompt.plots.rate_exponent import plot_rate_exponent
from largeprompt.runlog import run_stage

run_stage(snakemake, plot_rate_exponent)  # noqa: F821 (injected by Snakemake)
