"""Rule ``write_numbers`` (docs/architecture.md#numbers): figures/<run>/numbers.tex, the run's headline numbers as LaTeX
macros, from its claims ledger and summary tables by :mod:`largeprompt.ledger.numbers`."""
from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from largeprompt.io.parquet_io import ResultFileError, read_parquet
from largeprompt.io.repository import git_commit
from largeprompt.ledger.numbers import numbers_tex


def write_text_atomically(text: str, path: str | os.PathLike) -> Path:
    """Write ``text`` to ``path`` through a temporary file in its folder and a rename: a reader sees the old file or
    the whole new one, and a failed write leaves nothing behind (as :func:`largeprompt.io.parquet_io.write_parquet`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # as the figures: mkstemp's private 0600 would hide the file from a group
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ResultFileError(f"{path}: could not be written ({exc.strerror or exc}); nothing was left behind. Free "
                              "space or fix the folder's permissions, then rerun the same command") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_numbers(inputs, outputs, params, rule="write_numbers"):
    """Write figures/<run>/numbers.tex (``\\newcommand`` lines under a header naming the run, commit and date)."""
    root = Path(inputs["claims"]).parent.parent  # results/<run>/
    paths = inputs.get("tables", [])
    tables = {str(Path(p).relative_to(root)): read_parquet(p) for p in ([paths] if isinstance(paths, str) else paths)}
    written = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = numbers_tex(read_parquet(inputs["claims"]), tables, run=str(params["run"]), commit=git_commit(),
                       written=written)
    write_text_atomically(text, outputs["numbers"])
    macros = sum(line.startswith("\\newcommand") for line in text.splitlines())
    print(f"{rule}: {outputs['numbers']}: {macros} macros from the claims and {len(tables)} summary tables")
