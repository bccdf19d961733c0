from largeprompt.io.runlog import run_stage
from largeprompt.plots.fixed_query_bound import plot_fixed_query_bound

run_stage(snakemake, plot_fixed_query_bound)  # noqa: F821 (injected by Snakemake)
