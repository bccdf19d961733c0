from largeprompt.io.runlog import run_stage
from largeprompt.plots.balanced_flow import plot_balanced_flow

run_stage(snakemake, plot_balanced_flow)  # noqa: F821 (injected by Snakemake)
