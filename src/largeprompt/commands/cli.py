"""Command line: ``largeprompt inspect FILE.parquet|FIGURE.png|FIGURE.pdf`` (README.md, "Reading the cached results") and
``largeprompt claims RUN``, ``largeprompt compare RUN_A RUN_B`` (docs/experiments.md#claims),
``largeprompt bench`` (README.md, "Performance"), ``largeprompt publish RUN`` (a run's figures and tables into the docs) and
``largeprompt calibrate`` (the size and power of the ledger's tests on synthetic data, largeprompt.ledger.calibration)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

from largeprompt.commands import reading
from largeprompt.io.config import ConfigError, check_config_files
from largeprompt.io.figure_provenance import read_figure_record
from largeprompt.io.parquet_io import ResultFileError, read_parquet, read_provenance


def inspect_figure(path: str) -> str:
    """A figure's provenance record (docs/architecture.md#figure-provenance), as text."""
    try:
        record = read_figure_record(path)
    except (OSError, ValueError) as err:
        raise ResultFileError(f"{path}: cannot read its provenance ({err})") from None
    if record is None:
        raise ResultFileError(f"{path} carries no provenance record: redraw it with snakemake (its plot rule)")
    return "\n".join([f"# {path}", "", "## provenance", json.dumps(record, indent=2, sort_keys=True)])


def inspect(path: str, rows: int = 5) -> str:
    """Provenance, schema and the first rows of a result file, or a figure's provenance, as text."""
    if str(path).endswith((".png", ".pdf")):
        return inspect_figure(path)
    prov = read_provenance(path)
    frame = read_parquet(path)
    schema = pq.read_schema(path)
    lines = [f"# {path}", f"rows: {len(frame)}", "", "## provenance", json.dumps(prov, indent=2, sort_keys=True), "", "## schema"]
    lines += [f"  {field.name}: {field.type}" for field in schema]
    lines += ["", f"## first {min(rows, len(frame))} rows", frame.head(rows).to_string()]
    return "\n".join(lines)


def check_config_command(files) -> int:
    """``largeprompt check-config FILE...``: config/config.yaml with the overlays merged in, checked against the schema."""
    root = Path(__file__).resolve().parents[3]  # the checkout: src/largeprompt/commands/cli.py
    base = Path("config/config.yaml") if Path("config/config.yaml").is_file() else root / "config" / "config.yaml"
    schema = Path("workflow/schemas/config.schema.yaml")
    schema = schema if schema.is_file() else root / "workflow" / "schemas" / "config.schema.yaml"
    try:
        check_config_files(files, base, schema)
    except ConfigError as err:
        print(f"largeprompt check-config: {err}", file=sys.stderr)
        return 2
    print(f"{', '.join(files)}: valid over {base}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="largeprompt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="print a result file's provenance, schema and first rows, or a figure's provenance")
    p_inspect.add_argument("file")
    p_inspect.add_argument("-n", "--rows", type=int, default=5)
    p_check = sub.add_parser("check-config", help="check config overlays as `snakemake --configfile` would read them, "
                                                  "with one line per problem naming the file, line and key")
    p_check.add_argument("files", nargs="+")
    p_claims = sub.add_parser("claims", help="print a run's claims ledger: each claim's measured value, interval, "
                                             "prediction and verdict (docs/experiments.md#claims)")
    p_claims.add_argument("run")
    p_claims.add_argument("--format", choices=["table", "markdown", "json"], default="table")
    p_compare = sub.add_parser("compare", help="two runs side by side: differing config values, every claim, "
                                               "tables only one run has")
    p_compare.add_argument("run_a")
    p_compare.add_argument("run_b")
    p_calibrate = sub.add_parser("calibrate", help="measure the size and power of the claims ledger's tests on synthetic "
                                                   "data from a known truth (docs/experiments.md#claims)")
    p_calibrate.add_argument("--draws", type=int, default=400, help="synthetic draws per truth (fewer for costly tests)")
    p_calibrate.add_argument("--seed", type=int, default=0)
    p_calibrate.add_argument("--format", choices=["table", "markdown"], default="table")
    sub.add_parser("bench", help="run the performance benchmark (README.md, section Performance); see `largeprompt bench --help`", add_help=False)
    sub.add_parser("publish", help="copy a finished run's figures, small tables and stage times into the docs; "
                                   "see `largeprompt publish --help`", add_help=False)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        from largeprompt.bench import main as bench_main  # torch and the stages: only for this command
        return bench_main(argv[1:])
    if argv[:1] == ["publish"]:
        from largeprompt.commands.publish import main as publish_main
        return publish_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "check-config":
        return check_config_command(args.files)
    if args.command in ("claims", "compare"):
        try:
            print(reading.claims(args.run, args.format) if args.command == "claims"
                  else reading.compare(args.run_a, args.run_b))
        except reading.RunError as err:
            print(f"largeprompt {args.command}: error: {err}", file=sys.stderr)
            return 2
        return 0
    if args.command == "calibrate":
        from largeprompt.ledger.calibration import calibration_table  # the ledger's tests import torch
        table = calibration_table(args.draws, args.seed)
        print(reading.markdown(table) if args.format == "markdown" else table.to_string(index=False))
        return 0
    if args.command == "inspect":
        try:
            print(inspect(args.file, args.rows))
        except ResultFileError as err:
            print(f"largeprompt inspect: error: {err}", file=sys.stderr)
            return 2
        return 0
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
