from largeprompt.io.runlog import run_stage
from largeprompt.stages.summarize_training import summarize_training

run_stage(snakemake, summarize_training)  # noqa: F821 (injected by Snakemake)
