from largeprompt.plots.affine_limit import plot_affine_limit
from largeprompt.runlog import run_stage

run_stage(snakemake, plot_affine_limit)  # noqa: F821 (injected by Snakemake)
