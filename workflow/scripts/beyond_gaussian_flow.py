from largeprompt.io.runlog import run_stage
from largeprompt.stages.beyond_gaussian_flow import beyond_gaussian_flow

run_stage(snakemake, beyond_gaussian_flow)  # noqa: F821 (injected by Snakemake)
