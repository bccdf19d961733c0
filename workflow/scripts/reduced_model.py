from largeprompt.io.runlog import run_stage
from largeprompt.stages.reduced_model import reduced_model

run_stage(snakemake, reduced_model)  # noqa: F821 (injected by Snakemake)
