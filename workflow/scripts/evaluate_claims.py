from largeprompt.io.runlog import run_stage
from largeprompt.stages.evaluate_claims import evaluate_claims

run_stage(snakemake, evaluate_claims)  # noqa: F821 (injected by Snakemake)
