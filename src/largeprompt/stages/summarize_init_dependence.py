"""Rule ``summarize_init_dependence`` (docs/experiments.md#init_dependence): the fraction of each flow class with
its Wilson interval, and the cross-validated accuracy of each predictor of drift against the majority baseline."""
from __future__ import annotations

from largeprompt.icl.init_dependence import class_table, predictor_table
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.provenance import provenance


def summarize_init_dependence(inputs, outputs, params, rule="summarize_init_dependence"):
    """Write results/<run>/init_dependence/classes.parquet and predictors.parquet."""
    flows = read_parquet(inputs["flows"])
    level = 0.95
    classes, predictors = class_table(flows, level), predictor_table(flows, int(params["init_dependence"]["n_folds"]), level)
    for r in classes.itertuples():
        print(f"{r.flow_class:9s}: {r.n_flows}/{r.n_seeds} = {r.fraction:.3f} [{r.fraction_lo:.3f}, {r.fraction_hi:.3f}]")
    for r in predictors.itertuples():
        print(f"{r.predictor:32s} ({r.computed}): accuracy {r.accuracy:.3f} [{r.accuracy_lo:.3f}, {r.accuracy_hi:.3f}]"
              f" vs majority {r.majority_baseline:.3f}")
    prov = provenance(rule, params, run_seeds=sorted(flows["seed"]))
    write_parquet(classes, outputs["classes"], prov)
    write_parquet(predictors, outputs["predictors"], prov)
