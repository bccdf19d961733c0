from largeprompt.io.runlog import run_stage
from largeprompt.stages.write_numbers import write_numbers

run_stage(snakemake, write_numbers)  # noqa: F821 (injected by Snakemake)
