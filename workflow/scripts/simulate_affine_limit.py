from largeprompt.io.runlog import run_stage
from largeprompt.stages.simulate_affine_limit import simulate_affine_limit

run_stage(snakemake, simulate_affine_limit)  # noqa: F821 (injected by Snakemake)
