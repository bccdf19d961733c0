from largeprompt.io.runlog import run_stage
from largeprompt.stages.summarize_beyond_gaussian import summarize_beyond_gaussian

run_stage(snakemake, summarize_beyond_gaussian)  # noqa: F821 (injected by Snakemake)
