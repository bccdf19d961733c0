from largeprompt.io.runlog import run_stage
from largeprompt.plots.training_vs_prompt_length import plot_training_vs_prompt_length

run_stage(snakemake, plot_training_vs_prompt_length)  # noqa: F821 (injected by Snakemake)
