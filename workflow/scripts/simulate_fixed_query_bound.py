from largeprompt.io.runlog import run_stage
from largeprompt.stages.simulate_fixed_query_bound import simulate_fixed_query_bound

run_stage(snakemake, simulate_fixed_query_bound)  # noqa: F821 (injected by Snakemake)
