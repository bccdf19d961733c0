"""Parquet results: provenance, atomic writes, clear errors, `largeprompt inspect` (SPEC §5)."""
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from largeprompt import parquet_io
from largeprompt.parquet_io import ResultFileError, read_parquet, read_provenance, write_parquet
from largeprompt.provenance import provenance


def _frame():
    rng = np.random.default_rng(0)
    return pd.DataFrame({"prompt_length": [10, 100, 1000], "error": rng.random(3), "measure": ["gaussian"] * 3})


def test_round_trip_with_provenance(tmp_path):
    prov = provenance("simulate_affine_limit", {"n_prompts": 7, "prompt_lengths": (10, 100)}, seed=42)
    path = write_parquet(_frame(), tmp_path / "sub" / "x.parquet", prov)
    back = read_parquet(path)
    pd.testing.assert_frame_equal(back, _frame())
    meta = read_provenance(path)
    assert meta["rule"] == "simulate_affine_limit"
    assert meta["params"] == {"n_prompts": 7, "prompt_lengths": [10, 100]}
    assert meta["seed"] == 42
    assert {"numpy", "torch", "pyarrow", "python", "largeprompt"} <= set(meta["versions"])
    assert meta["git_commit"]


def test_same_data_gives_identical_bytes(tmp_path):
    prov = provenance("r", {"a": 1}, seed=1)
    a = write_parquet(_frame(), tmp_path / "a.parquet", prov)
    b = write_parquet(_frame(), tmp_path / "b.parquet", prov)
    assert a.read_bytes() == b.read_bytes()


def test_killed_write_leaves_no_file(tmp_path, monkeypatch):
    target = tmp_path / "out.parquet"

    def crash(table, where, **kwargs):
        with open(where, "wb") as fh:
            fh.write(b"PAR1 half a file")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(parquet_io.pq, "write_table", crash)
    with pytest.raises(KeyboardInterrupt):
        write_parquet(_frame(), target, {"rule": "r"})
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_missing_file_names_the_rule_that_makes_it(tmp_path):
    with pytest.raises(ResultFileError, match="make_queries"):
        read_parquet(tmp_path / "results" / "data" / "queries.parquet")
    with pytest.raises(ResultFileError, match="no such result file"):
        read_provenance(tmp_path / "elsewhere.parquet")


def test_corrupt_and_foreign_files_are_reported(tmp_path):
    bad = tmp_path / "results" / "bounds" / "affine_limit.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(ResultFileError, match="simulate_affine_limit"):
        read_parquet(bad)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(__import__("pyarrow").Table.from_pandas(_frame()), foreign)
    with pytest.raises(ResultFileError, match="provenance"):
        read_provenance(foreign)


def _inspect(*args):
    return subprocess.run([sys.executable, "-m", "largeprompt.cli", "inspect", *args], capture_output=True, text=True)


def test_inspect_prints_provenance_schema_and_rows(tmp_path):
    path = write_parquet(_frame(), tmp_path / "x.parquet", provenance("rule_x", {"n_prompts": 123}, seed=9))
    proc = _inspect(str(path), "--rows", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert '"rule": "rule_x"' in out and '"n_prompts": 123' in out and '"seed": 9' in out
    assert "prompt_length: int64" in out and "error: double" in out
    assert "rows: 3" in out and "first 2 rows" in out


def test_inspect_errors_are_clear(tmp_path):
    proc = _inspect(str(tmp_path / "results/train/softmax/L10/seed0.parquet"))
    assert proc.returncode == 2 and "no such result file" in proc.stderr and "train" in proc.stderr
    corrupt = tmp_path / "c.parquet"
    corrupt.write_bytes(b"\x00garbage")
    proc = _inspect(str(corrupt))
    assert proc.returncode == 2 and "not a readable Parquet file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_parquet_output_of_the_workflow_has_a_producing_rule():
    """parquet_io.PRODUCERS names, for every Parquet path in the rules, the rule that declares it."""
    import re

    from conftest import REPO

    checked = 0
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        for rule, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", text, flags=re.S | re.M):
            outputs = body.split("output:", 1)[1].split("params:" if "params:" in body else "log:", 1)[0] if "output:" in body else ""
            for path in re.findall(r'"(results/[^"]+\.parquet)"', outputs):
                concrete = re.sub(r"\{[^}]+\}", "0", path)
                assert parquet_io.producing_rule(concrete) == rule, (path, rule)
                checked += 1
    assert checked >= 14
