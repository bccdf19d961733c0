from largeprompt.io.runlog import run_stage
from largeprompt.plots.output_concentration import plot_output_concentration

run_stage(snakemake, plot_output_concentration)  # noqa: F821 (injected by Snakemake)
