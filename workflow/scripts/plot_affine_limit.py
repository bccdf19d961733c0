from largeprompt.io.runlog import run_stage
from largeprompt.plots.affine_limit import plot_affine_limit

run_stage(snakemake, plot_affine_limit)  # noqa: F821 (injected by Snakemake)
