from largeprompt.plots.training_vs_prompt_length import plot_training_vs_prompt_length
from largeprompt.runlog import run_stage

run_stage(snakemake, plot_training_vs_prompt_length)  # noqa: F821 (injected by Snakemake)
