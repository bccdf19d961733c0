"""Parquet results with provenance in the schema metadata, written atomically (SPEC §5).

Provenance lives under the schema-metadata key ``largeprompt`` as JSON. Files are written to a
temporary name in the same folder, fsynced and renamed, so a killed job never leaves a file
that looks complete. No timestamps are stored: the same config and seed give identical bytes.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

METADATA_KEY = b"largeprompt"

# Which rule makes which file, for error messages about missing inputs.
PRODUCERS = (
    (r"results/data/queries\.parquet$", "make_queries"),
    (r"results/data/icl_test\.parquet$", "make_icl_test_set"),
    (r"results/data/bayes_risk\.parquet$", "bayes_risk"),
    (r"results/train/summary\.parquet$", "summarize_training"),
    (r"results/train/", "train"),
    (r"results/infinite/full_model_seed\d+\.parquet$", "full_model_flow"),
    (r"results/infinite/balanced_flow\.parquet$", "balanced_flow"),
    (r"results/infinite/reduced_model\.parquet$", "reduced_model"),
    (r"results/infinite/trajectory_gap\.parquet$", "trajectory_gap"),
    (r"results/bounds/affine_limit\.parquet$", "simulate_affine_limit"),
    (r"results/bounds/errors/", "simulate_errors"),
    (r"results/bounds/(output|gradient)_errors\.parquet$", "collect_errors"),
    (r"results/bounds/rates\.parquet$", "estimate_rates"),
    (r"results/bounds/fixed_query_bounds\.parquet$", "simulate_fixed_query_bounds"),
)


class ResultFileError(RuntimeError):
    """A Parquet result is missing, unreadable or lacks provenance."""


def producing_rule(path: str | os.PathLike) -> str | None:
    p = Path(path).as_posix()
    for pattern, rule in PRODUCERS:
        if re.search(pattern, p):
            return rule
    return None


def _json_default(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def plain(obj):
    """Config/params objects (Snakemake Namedlist, numpy scalars, tuples) as plain JSON values."""
    return json.loads(json.dumps(obj, default=_json_default, sort_keys=True))


def write_parquet(frame: pd.DataFrame, path: str | os.PathLike, provenance: dict) -> Path:
    """Write ``frame`` to ``path`` atomically with ``provenance`` in the schema metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[METADATA_KEY] = json.dumps(plain(provenance), sort_keys=True).encode()
    table = table.replace_schema_metadata(meta)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _missing_message(path: Path) -> str:
    rule = producing_rule(path)
    hint = f" It is made by rule '{rule}': run `snakemake --cores 2 {path.as_posix()}`." if rule else ""
    return f"{path}: no such result file.{hint}"


def read_provenance(path: str | os.PathLike) -> dict:
    """The provenance dict stored in ``path``'s schema metadata."""
    path = Path(path)
    if not path.exists():
        raise ResultFileError(_missing_message(path))
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise ResultFileError(f"{path}: not a readable Parquet file ({exc}). Delete it and rerun its rule.") from exc
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise ResultFileError(f"{path}: no largeprompt provenance in its schema metadata; it was not written by this pipeline.")
    return json.loads(raw)


def read_parquet(path: str | os.PathLike, columns=None) -> pd.DataFrame:
    """Read a result, with an error that names the file and the rule that makes it."""
    path = Path(path)
    if not path.exists():
        raise ResultFileError(_missing_message(path))
    try:
        return pq.read_table(path, columns=columns).to_pandas()
    except (pa.ArrowException, OSError) as exc:
        rule = producing_rule(path)
        hint = f" Delete it and rerun rule '{rule}'." if rule else " Delete it and rerun its rule."
        raise ResultFileError(f"{path}: not a readable Parquet file ({exc}).{hint}") from exc
