from largeprompt.io.runlog import run_stage
from largeprompt.stages.make_affine_limit_queries import make_affine_limit_queries

run_stage(snakemake, make_affine_limit_queries)  # noqa: F821 (injected by Snakemake)
