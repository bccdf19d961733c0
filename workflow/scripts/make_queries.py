from largeprompt.io.runlog import run_stage
from largeprompt.stages.data import make_queries

run_stage(snakemake, make_queries)  # noqa: F821 (injected by Snakemake)
