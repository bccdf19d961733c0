# largeprompt: figure pipeline for "Softmax as Linear Attention in the Large-Prompt Regime"
# (Boursier & Boyer, ICML 2026). Stages: data -> training at each prompt length -> infinite-prompt
# dynamics -> error bounds -> figures. Run `snakemake --cores 2`; see README.md.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"


import sys

# The report's landing page shows every figure with its caption (src/largeprompt/commands/report.py).
from largeprompt.io.pipeline import report_hint, share_producers
from largeprompt.commands.report import landing_page


report: landing_page("workflow/report/workflow.rst")


# `snakemake --report` reads the figures of the run the config names: say so when that run has none yet.
if "--report" in sys.argv and (hint := report_hint(RUN, FIGURES)):
    print(hint, file=sys.stderr)


include: "workflow/rules/affine_limit.smk"
include: "workflow/rules/concentration.smk"
include: "workflow/rules/fixed_query_bound.smk"
include: "workflow/rules/icl.smk"
include: "workflow/rules/infinite.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/init_dependence.smk"
include: "workflow/rules/trajectory_transfer.smk"
include: "workflow/rules/beyond_gaussian.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/claims.smk"


# With --cache (SHARE), the shared rules keep no benchmark record: Snakemake cannot time a job it fetches.
if SHARE:
    for shared in workflow.rules:
        if shared.cache and shared.cache.output:
            shared._benchmark = None


# Which rule makes which result file, for the one-line message of a job that meets a missing or corrupt input
# (largeprompt.io.parquet_io.producing_rule): derived from the rules above, passed to the jobs' environment.
share_producers((r.name, [str(f) for f in r.output]) for r in workflow.rules)


# Every figure, the run's numbers.tex and every result file: a plain `snakemake` rebuilds any missing one, whatever
# exists downstream.
rule all:
    default_target: True
    input:
        expand(figures("{name}.{ext}"), name=FIGURES, ext=["pdf", "png"]),
        figures("numbers.tex"),
        result_files(workflow.rules),
