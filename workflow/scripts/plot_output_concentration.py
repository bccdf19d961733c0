from largeprompt.plots.output_concentration import plot_output_concentration
from largeprompt.runlog import run_stage

run_stage(snakemake, plot_output_concentration)  # noqa: F821 (injected by Snakemake)
