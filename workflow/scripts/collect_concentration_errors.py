from largeprompt.io.runlog import run_stage
from largeprompt.stages.collect_concentration_errors import collect_concentration_errors

run_stage(snakemake, collect_concentration_errors)  # noqa: F821 (injected by Snakemake)
