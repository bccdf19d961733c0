from largeprompt.io.runlog import run_stage
from largeprompt.plots.init_dependence import plot_init_dependence

run_stage(snakemake, plot_init_dependence)  # noqa: F821 (injected by Snakemake)
