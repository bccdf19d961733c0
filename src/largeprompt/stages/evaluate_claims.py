"""Rule ``evaluate_claims`` (docs/experiments.md#claims): the run's claims ledger, one row per claim, computed from
the run's own summary tables by :mod:`largeprompt.ledger.claims`."""
from __future__ import annotations

from pathlib import Path

from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.provenance import provenance
from largeprompt.ledger.claims import evaluate


def evaluate_claims(inputs, outputs, params, rule="evaluate_claims"):
    """Write results/<run>/claims/claims.parquet."""
    root = Path(outputs["claims"]).parent.parent  # results/<run>/
    tables = {str(Path(p).relative_to(root)): p for p in inputs["tables"]}
    ledger = evaluate(lambda name: read_parquet(tables[name]) if name in tables else None)
    for r in ledger.itertuples():
        print(f"{r.claim_id:32s} {r.verdict:12s} {r.value:.4g} [{r.ci_low:.4g}, {r.ci_high:.4g}] vs {r.predicted}")
    write_parquet(ledger, outputs["claims"], provenance(rule, params, base_seed=params.get("seed")))
