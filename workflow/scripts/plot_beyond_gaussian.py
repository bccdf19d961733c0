from largeprompt.io.runlog import run_stage
from largeprompt.plots.beyond_gaussian import plot_beyond_gaussian

run_stage(snakemake, plot_beyond_gaussian)  # noqa: F821 (injected by Snakemake)
