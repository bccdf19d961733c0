from largeprompt.io.runlog import run_stage
from largeprompt.stages.training_summary import summarize_training

run_stage(snakemake, summarize_training)  # noqa: F821 (injected by Snakemake)
