from largeprompt.io.runlog import run_stage
from largeprompt.stages.balanced_flow import balanced_flow

run_stage(snakemake, balanced_flow)  # noqa: F821 (injected by Snakemake)
