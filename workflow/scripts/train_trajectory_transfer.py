from largeprompt.io.runlog import run_stage
from largeprompt.stages.train_trajectory_transfer import train_trajectory_transfer

run_stage(snakemake, train_trajectory_transfer)  # noqa: F821 (injected by Snakemake)
