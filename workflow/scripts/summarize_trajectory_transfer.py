from largeprompt.io.runlog import run_stage
from largeprompt.stages.summarize_trajectory_transfer import summarize_trajectory_transfer

run_stage(snakemake, summarize_trajectory_transfer)  # noqa: F821 (injected by Snakemake)
