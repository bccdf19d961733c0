from largeprompt.io.runlog import run_stage
from largeprompt.stages.full_model_flow import full_model_flow

run_stage(snakemake, full_model_flow)  # noqa: F821 (injected by Snakemake)
