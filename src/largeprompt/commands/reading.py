"""``largeprompt claims RUN`` and ``largeprompt compare RUN_A RUN_B`` (docs/experiments.md#claims): they read the
ledgers and the tables' provenance under results/ and recompute nothing."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from largeprompt.io.parquet_io import ResultFileError, read_parquet, read_provenance
from largeprompt.ledger.compare import config_values, differing_values, only_in_one, side_by_side

LEDGER = Path("claims") / "claims.parquet"
SHOWN = ["claim_id", "kind", "verdict", "verdict_unadjusted", "p_holm", "value", "ci_low", "ci_high", "predicted"]


class RunError(Exception):
    """A run that does not exist or is half-built: one line, exit code 2."""


def runs_under(root: Path) -> list[str]:
    folder = root / "results"
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) if folder.is_dir() else []


def ledger_of(run: str, root: Path) -> pd.DataFrame:
    """The run's claims.parquet, or a RunError naming the runs that exist or the command that builds the ledger."""
    if "/" in run or run in ("", ".", ".."):
        raise RunError(f"{run!r} is not a run name (no '/', not '.' or '..')")
    if not (root / "results" / run).is_dir():
        raise RunError(f"no run {run!r} under {root / 'results'}; runs: {', '.join(runs_under(root)) or 'none'}")
    path = root / "results" / run / LEDGER
    if not path.is_file():
        raise RunError(f"run {run!r} is half-built: {path} is missing; build it with `snakemake --cores 2 "
                       f"results/{run}/{LEDGER}` (with the --configfile that names run {run!r})")
    return read_parquet(path)


def _cell(x) -> str:
    if isinstance(x, float):
        return "" if x != x else f"{x:.4g}"
    return str(x)


def markdown(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(_cell(x).replace("|", "\\|") for x in r) + " |" for r in frame.itertuples(index=False)]
    return "\n".join(lines)


def format_ledger(ledger: pd.DataFrame, fmt: str) -> str:
    """The ledger as a terminal table, Markdown (with each claim's sentence and why) or JSON records."""
    if fmt == "json":
        return json.dumps(json.loads(ledger.to_json(orient="records")), indent=1, ensure_ascii=False)
    if fmt == "markdown":
        return markdown(ledger[["claim_id", "kind", "claim", "verdict", "verdict_unadjusted", "p_value", "p_holm",
                                "value", "ci_low", "ci_high", "predicted", "why", "figure"]])
    counts = ledger["verdict"].value_counts()
    head = ", ".join(f"{n} {verdict}" for verdict, n in counts.items())
    with pd.option_context("display.width", 200, "display.max_colwidth", 40):
        return f"{len(ledger)} claims: {head}\n" + ledger[SHOWN].to_string(index=False)


def claims(run: str, fmt: str = "table", root: Path = Path(".")) -> str:
    return format_ledger(ledger_of(run, root), fmt)


def _provenance(path: Path) -> dict | None:
    try:
        return read_provenance(path)
    except ResultFileError:
        return None


def tables_of(run: str, root: Path) -> dict[str, Path]:
    folder = root / "results" / run
    return {str(p.relative_to(folder)): p for p in folder.rglob("*.parquet") if "checkpoints" not in p.parts}


def compare(run_a: str, run_b: str, root: Path = Path(".")) -> str:
    """The config values that differ, every claim side by side, and the tables only one run has."""
    ledgers = [ledger_of(run, root) for run in (run_a, run_b)]
    tables = [tables_of(run, root) for run in (run_a, run_b)]
    values = [config_values([record for p in t.values() if (record := _provenance(p))]) for t in tables]
    diff = differing_values(*values)
    diff[["a", "b"]] = diff[["a", "b"]].map(str)  # exact values: 1e-11 must not print as 0.0
    diff = diff.rename(columns={"a": run_a, "b": run_b})
    both = side_by_side(*ledgers)
    only = only_in_one(set(tables[0]), set(tables[1])).replace({"only_in": {"a": run_a, "b": run_b}})
    with pd.option_context("display.width", 220, "display.max_colwidth", 50):
        parts = [f"# {run_a} vs {run_b}", f"## config values that differ ({len(diff)})",
                 diff.to_string(index=False) if len(diff) else "none",
                 f"## claims ({int(both['moved'].sum())} of {len(both)} moved by more than their intervals)",
                 both.to_string(index=False), f"## tables in one run only ({len(only)})",
                 only.to_string(index=False) if len(only) else "none"]
    return "\n".join(parts)
