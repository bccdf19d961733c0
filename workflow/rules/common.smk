# Shared helpers: config validation and the list of figures. No maths here (SPEC §3.1).
import os

from largeprompt.config import ConfigError, canonical, check_config

SCHEMA = os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml")

# Clear, key-naming errors first; then Snakemake's own validation fills schema defaults.
try:
    check_config(config, SCHEMA)
except ConfigError as err:
    raise WorkflowError(str(err)) from None
validate(config, SCHEMA)

ENV = "../envs/largeprompt.yaml"


def cfg(*keys):
    """The config value at ``keys``, key order canonicalised: use it for every ``params:`` entry."""
    node = config
    for key in keys:
        node = node[key]
    return canonical(node)

FIGURES = ["affine_limit"]


def all_figures():
    return expand("figures/{name}.{ext}", name=FIGURES, ext=["pdf", "png"])
