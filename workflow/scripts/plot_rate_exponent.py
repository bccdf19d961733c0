from largeprompt.io.runlog import run_stage
from largeprompt.plots.rate_exponent import plot_rate_exponent

run_stage(snakemake, plot_rate_exponent)  # noqa: F821 (injected by Snakemake)
