from largeprompt.runlog import run_stage
from largeprompt.stages.infinite import trajectory_gap

run_stage(snakemake, trajectory_gap)  # noqa: F821 (injected by Snakemake)
