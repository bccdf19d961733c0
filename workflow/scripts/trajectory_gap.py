from largeprompt.io.runlog import run_stage
from largeprompt.stages.trajectory_gap import trajectory_gap

run_stage(snakemake, trajectory_gap)  # noqa: F821 (injected by Snakemake)
