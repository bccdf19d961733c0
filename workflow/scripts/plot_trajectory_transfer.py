from largeprompt.io.runlog import run_stage
from largeprompt.plots.trajectory_transfer import plot_trajectory_transfer

run_stage(snakemake, plot_trajectory_transfer)  # noqa: F821 (injected by Snakemake)
