from largeprompt.io.runlog import run_stage
from largeprompt.stages.make_icl_test_set import make_icl_test_set

run_stage(snakemake, make_icl_test_set)  # noqa: F821 (injected by Snakemake)
