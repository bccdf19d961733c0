"""What a figure records about where it comes from (docs/architecture.md#figure-provenance): the git commit, the run,
the rule, the sha256 of the rule's params (code fingerprints included) and the sha256 of each input table. PNG files
carry it as a text chunk ``largeprompt``, PDF files as JSON in their Keywords entry (no dates: a rerun on the same
inputs writes the same bytes). :func:`largeprompt.io.runlog.run_stage` sets the record of the running plot job;
:func:`largeprompt.plots.style.save_figure` writes it."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from largeprompt.io.repository import git_commit

KEY = "largeprompt"
_current: dict | None = None


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def params_sha256(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()


def _files(inputs) -> list[str]:
    """The input files of a job: a list of paths, or a dict of paths and lists of paths."""
    out = []
    for value in (inputs.values() if isinstance(inputs, dict) else inputs):
        out += [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    return sorted(set(out))


def figure_record(rule: str, params: dict, inputs, output: str | Path) -> dict:
    """The record of one plot job: its run is the folder of its output, figures/<run>/."""
    return {"git_commit": git_commit(), "run": Path(output).parent.name, "rule": rule,
            "params_sha256": params_sha256(params), "inputs": {p: sha256_file(p) for p in _files(inputs)}}


def set_current(record: dict | None) -> None:
    global _current
    _current = record


def current() -> dict | None:
    return _current


def png_metadata(record: dict | None) -> dict:
    return {KEY: json.dumps(record, sort_keys=True)} if record else {}


def pdf_metadata(record: dict | None) -> dict:
    out = {"CreationDate": None, "ModDate": None}
    return out | ({"Keywords": json.dumps(record, sort_keys=True)} if record else {})


def _pdf_string(data: bytes, start: int) -> str:
    """The PDF literal string that opens at data[start] == '(' (escapes \\\\, \\( and \\) undone)."""
    out, i, depth = bytearray(), start + 1, 1
    while i < len(data):
        c = data[i]
        if c == 0x5C:  # backslash
            out.append(data[i + 1])
            i += 2
            continue
        depth += (c == 0x28) - (c == 0x29)
        if depth == 0:
            return out.decode("latin-1")
        out.append(c)
        i += 1
    raise ValueError("unterminated PDF string")


def read_figure_record(path: str | Path) -> dict | None:
    """The record of a PNG or PDF written by save_figure, or None if it has none."""
    path = Path(path)
    if path.suffix == ".png":
        from PIL import Image  # matplotlib's own dependency
        with Image.open(path) as image:
            text = image.text.get(KEY)
        return json.loads(text) if text else None
    if path.suffix == ".pdf":
        data = path.read_bytes()
        match = re.search(rb"/Keywords\s*\(", data)
        return json.loads(_pdf_string(data, match.end() - 1)) if match else None
    raise ValueError(f"{path}: not a figure (.png or .pdf)")
