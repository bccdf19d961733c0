"""Parquet results with provenance in the schema metadata, written atomically (README.md, "Reading the cached results").

Provenance lives under the schema-metadata key ``largeprompt`` as JSON. Files are written to a
temporary name in the same folder, fsynced and renamed, so a killed job never leaves a file
that looks complete. No timestamps are stored: the same config and seed give identical bytes.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

METADATA_KEY = b"largeprompt"
PRODUCERS_ENV = "LARGEPROMPT_PRODUCERS"  # set by the Snakefile (largeprompt.io.pipeline.producer_patterns)
PRODUCERS_FILE = Path(".snakemake") / "largeprompt_producers.json"  # the same, kept for `largeprompt inspect`

LEGACY_COLUMNS = {"measure": "token_measure"}  # old column name → today's (tables written before the rename)
RESULT_PATH = re.compile(r"(?:^|/)results/(?P<run>[^/]+)/(?P<rest>.+)$")


class ResultFileError(RuntimeError):
    """A Parquet result is missing, unreadable or lacks provenance."""


def producing_rule(path: str | os.PathLike) -> str | None:
    """The rule that writes ``path`` (a file under results/<run>/), or None: from the patterns the Snakefile derives
    from its rules and passes to its jobs (:func:`largeprompt.io.pipeline.producer_patterns`)."""
    match = RESULT_PATH.search(Path(path).as_posix())
    if match is None:
        return None
    for pattern, rule in json.loads(os.environ.get(PRODUCERS_ENV) or _saved_producers(Path(path))):
        if re.search(pattern, match["rest"]):
            return rule
    return None


def _saved_producers(path: Path) -> str:
    """The patterns the last Snakemake of the checkout holding ``path`` (or of the working directory) saved, or
    "[]" outside any checkout that Snakemake has parsed."""
    for folder in [*Path(os.path.abspath(path)).parents, Path.cwd()]:
        saved = folder / PRODUCERS_FILE
        if saved.is_file():
            try:
                return saved.read_text()
            except OSError:
                return "[]"
    return "[]"


def rebuild_command(path: str | os.PathLike) -> str:
    """The Snakemake command that rebuilds ``path`` (and what depends on it is then rerun by Snakemake)."""
    p = Path(path).as_posix()
    match = RESULT_PATH.search(p)
    target = p[match.start():].lstrip("/") if match else p
    run = match["run"] if match else "default"
    overlay = "" if run == "default" else f" --configfile {_overlay_of(run)}"
    return f"snakemake --cores 2 --force {target}{overlay}"


def _overlay_of(run: str) -> str:
    """config/<file>.yaml whose ``run`` key is ``run`` (looked up in ./config), or a placeholder."""
    named = Path("config") / f"{run}.yaml"  # config/<run>.yaml first: other overlays may reuse its run name
    for candidate in [named] * named.is_file() + sorted(Path("config").glob("*.yaml")):
        try:
            if re.search(rf"^run:\s*['\"]?{re.escape(run)}['\"]?\s*(#.*)?$", candidate.read_text(), re.M):
                return candidate.as_posix()
        except OSError:
            continue
    return f"<the config file with run: {run}>"


def _problem(path: Path, what: str) -> str:
    """One line: the file, what is wrong, the rule that makes it and the command that rebuilds it."""
    rule = producing_rule(path)
    made_by = f"made by rule '{rule}'; " if rule else ""
    return f"{path}: {what}; {made_by}rebuild it with: {rebuild_command(path)}"


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
    return write_parquet_parts([frame], path, provenance)


def write_parquet_parts(frames: Iterable[pd.DataFrame], path: str | os.PathLike, provenance: dict) -> Path:
    """Write the concatenation of ``frames`` (same columns) to ``path`` atomically, holding one part at a time."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    writer = None
    try:
        for frame in frames:
            table = pa.Table.from_pandas(frame, preserve_index=False)
            if writer is None:
                meta = dict(table.schema.metadata or {})
                meta[METADATA_KEY] = json.dumps(plain(provenance), sort_keys=True).encode()
                schema = table.schema.with_metadata(meta)
                writer = pq.ParquetWriter(tmp, schema, compression="zstd")
            writer.write_table(table.replace_schema_metadata(schema.metadata).cast(schema))
        if writer is None:
            raise ValueError(f"{path}: nothing to write (no parts)")
        writer.close()
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # as the figures and logs: mkstemp's private 0600 would hide results from a group
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a quota, a read-only folder: one line naming the file
        _discard(writer, tmp)
        raise ResultFileError(f"{path}: could not be written ({exc.strerror or exc}); nothing was left behind. Free "
                              "space or fix the folder's permissions, then rerun the same command") from exc
    except BaseException:
        _discard(writer, tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _discard(writer, tmp) -> None:
    """Close the writer and delete the temporary file of a write that failed."""
    try:
        if writer is not None and writer.is_open:
            writer.close()
    except OSError:
        pass
    Path(tmp).unlink(missing_ok=True)


def read_provenance(path: str | os.PathLike) -> dict:
    """The provenance dict stored in ``path``'s schema metadata."""
    path = Path(path)
    if not path.exists():
        raise ResultFileError(_problem(path, "no such result file"))
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise ResultFileError(_problem(path, f"not a readable Parquet file ({exc})")) from exc
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise ResultFileError(f"{path}: no largeprompt provenance in its schema metadata; it was not written by this pipeline.")
    return json.loads(raw)


def read_parquet(path: str | os.PathLike, columns=None, filters=None) -> pd.DataFrame:
    """Read a result (optionally only the rows matching pyarrow ``filters``), with an error that names the
    file and the rule that makes it."""
    return _read_table(path, columns, filters).to_pandas()


def distinct_keys(path: str | os.PathLike, columns: list[str]) -> list[tuple]:
    """The distinct values of ``columns`` in a result, sorted, read without loading the other columns."""
    keys = _read_table(path, columns).group_by(columns).aggregate([])
    return sorted(zip(*(keys.column(name).to_pylist() for name in columns)))


def _legacy_names(path: Path) -> dict[str, str]:
    """{today's name: the name in ``path``} for the LEGACY_COLUMNS that ``path`` still carries under their old name."""
    names = set(pq.read_schema(path).names)
    return {new: old for old, new in LEGACY_COLUMNS.items() if old in names and new not in names}


def _renamed_filters(filters, names: dict[str, str]):
    """pyarrow DNF ``filters`` (a list of tuples, or a list of such lists) with their column names mapped by ``names``."""
    if not filters or not names:
        return filters
    if isinstance(filters[0], tuple):
        return [(names.get(col, col), op, value) for col, op, value in filters]
    return [_renamed_filters(conjunction, names) for conjunction in filters]


def _read_table(path: str | os.PathLike, columns=None, filters=None) -> pa.Table:
    """The table at ``path``; a table written before a rename (LEGACY_COLUMNS) reads under today's names."""
    path = Path(path)
    if not path.exists():
        raise ResultFileError(_problem(path, "no such result file"))
    try:
        legacy = _legacy_names(path)
        wanted = None if columns is None else [legacy.get(c, c) for c in columns]
        table = pq.read_table(path, columns=wanted, filters=_renamed_filters(filters, legacy))
    except (pa.ArrowException, OSError) as exc:
        raise ResultFileError(_problem(path, f"not a readable Parquet file ({exc})")) from exc
    if not legacy:
        return table
    back = {old: new for new, old in legacy.items()}
    return table.rename_columns([back.get(name, name) for name in table.column_names])
