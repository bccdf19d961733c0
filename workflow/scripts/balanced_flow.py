from largeprompt.io.runlog import run_stage
from largeprompt.stages.infinite import balanced_flow

run_stage(snakemake, balanced_flow)  # noqa: F821 (injected by Snakemake)
