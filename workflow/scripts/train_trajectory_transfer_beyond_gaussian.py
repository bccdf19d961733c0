from largeprompt.io.runlog import run_stage
from largeprompt.stages.train_trajectory_transfer_beyond_gaussian import train_trajectory_transfer_beyond_gaussian

run_stage(snakemake, train_trajectory_transfer_beyond_gaussian)  # noqa: F821 (injected by Snakemake)
