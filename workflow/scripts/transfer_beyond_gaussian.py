from largeprompt.io.runlog import run_stage
from largeprompt.stages.transfer_beyond_gaussian import transfer_beyond_gaussian

run_stage(snakemake, transfer_beyond_gaussian)  # noqa: F821 (injected by Snakemake)
