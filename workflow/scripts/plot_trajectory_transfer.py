from largeprompt.plots.trajectory_transfer import plot_trajectory_transfer
from largeprompt.runlog import run_stage

run_stage(snakemake, plot_trajectory_transfer)  # noqa: F821 (injected by Snakemake)
