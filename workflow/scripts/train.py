from largeprompt.io.runlog import run_stage
from largeprompt.stages.train import train

run_stage(snakemake, train)  # noqa: F821 (injected by Snakemake)
