from largeprompt.io.runlog import run_stage
from largeprompt.stages.train_transfer import train_transfer

run_stage(snakemake, train_transfer)  # noqa: F821 (injected by Snakemake)
