from largeprompt.io.runlog import run_stage
from largeprompt.stages.flow_beyond_gaussian import flow_beyond_gaussian

run_stage(snakemake, flow_beyond_gaussian)  # noqa: F821 (injected by Snakemake)
