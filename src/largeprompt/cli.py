"""Command line: ``largeprompt inspect FILE.parquet`` (SPEC §5) and ``largeprompt bench`` (SPEC §4)."""
from __future__ import annotations

import argparse
import json
import sys

from .parquet_io import ResultFileError, read_parquet, read_provenance


def inspect(path: str, rows: int = 5) -> str:
    """Provenance, schema and the first rows of a result file, as text."""
    import pyarrow.parquet as pq

    prov = read_provenance(path)
    frame = read_parquet(path)
    schema = pq.read_schema(path)
    lines = [f"# {path}", f"rows: {len(frame)}", "", "## provenance", json.dumps(prov, indent=2, sort_keys=True), "", "## schema"]
    lines += [f"  {field.name}: {field.type}" for field in schema]
    lines += ["", f"## first {min(rows, len(frame))} rows", frame.head(rows).to_string()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="largeprompt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="print a result file's provenance, schema and first rows")
    p_inspect.add_argument("file")
    p_inspect.add_argument("-n", "--rows", type=int, default=5)
    p_bench = sub.add_parser("bench", help="run the performance benchmark (SPEC §4)")
    p_bench.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke check")
    p_bench.add_argument("--skip-pipeline", action="store_true", help="skip the whole-pipeline timings")
    args = parser.parse_args(argv)
    if args.command == "inspect":
        try:
            print(inspect(args.file, args.rows))
        except ResultFileError as err:
            print(f"largeprompt inspect: error: {err}", file=sys.stderr)
            return 2
        return 0
    if args.command == "bench":
        from .bench import run_benchmarks

        return run_benchmarks(quick=args.quick, pipeline=not args.skip_pipeline)
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
