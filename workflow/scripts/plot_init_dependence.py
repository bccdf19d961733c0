from largeprompt.plots.init_dependence import plot_init_dependence
from largeprompt.runlog import run_stage

run_stage(snakemake, plot_init_dependence)  # noqa: F821 (injected by Snakemake)
