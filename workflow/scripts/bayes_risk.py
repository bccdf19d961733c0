from largeprompt.io.runlog import run_stage
from largeprompt.stages.bayes_risk import bayes_risk

run_stage(snakemake, bayes_risk)  # noqa: F821 (injected by Snakemake)
