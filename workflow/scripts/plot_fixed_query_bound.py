from largeprompt.plots.fixed_query_bound import plot_fixed_query_bound
from largeprompt.runlog import run_stage

run_stage(snakemake, plot_fixed_query_bound)  # noqa: F821 (injected by Snakemake)
