from largeprompt.plots.balanced_flow import plot_balanced_flow
from largeprompt.runlog import run_stage

run_stage(snakemake, plot_balanced_flow)  # noqa: F821 (injected by Snakemake)
