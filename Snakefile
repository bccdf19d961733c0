# largeprompt: figure pipeline for "Softmax as Linear Attention in the Large-Prompt Regime"
# (Boursier & Boyer, ICML 2026). Stages: data -> training at each prompt length -> infinite-prompt
# dynamics -> error bounds -> figures. Run `snakemake --cores 2`; see README.md.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"


# The report's landing page shows every figure with its caption (src/largeprompt/report.py).
from largeprompt.report import landing_page


report: landing_page("workflow/report/workflow.rst")


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/infinite.smk"
include: "workflow/rules/affine_limit.smk"
include: "workflow/rules/concentration.smk"
include: "workflow/rules/bounds.smk"
include: "workflow/rules/figures.smk"


rule all:
    default_target: True
    input:
        expand(figures("{name}.{ext}"), name=FIGURES, ext=["pdf", "png"]),
