"""Parquet results: provenance, atomic writes, clear errors, `largeprompt inspect` (README.md, "Reading the cached results")."""
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from helpers import workflow_rules
from largeprompt.core.devices import resolve_device
from largeprompt.io import parquet_io
from largeprompt.io.parquet_io import PRODUCERS_ENV, ResultFileError, distinct_keys, read_parquet, read_provenance, write_parquet
from largeprompt.io.pipeline import Runtime, producer_patterns, share_producers
from largeprompt.io.provenance import provenance


@pytest.fixture
def in_a_job(monkeypatch):
    """The environment of a Snakemake job: the Snakefile hands its jobs which rule makes which result file."""
    rules = workflow_rules()
    monkeypatch.setenv(PRODUCERS_ENV, producer_patterns((r.name, list(r.outputs)) for r in rules.values()))
    return rules


def _frame():
    rng = np.random.default_rng(0)
    return pd.DataFrame({"prompt_length": [10, 100, 1000], "error": rng.random(3), "token_measure": ["gaussian"] * 3})


def test_round_trip_with_provenance(tmp_path):
    params = {"affine_limit": {"n_prompts": 7, "prompt_lengths": (10, 100)}, "seed": 42}
    prov = provenance("simulate_affine_limit", params, base_seed=42, run_seeds=np.array([3, 1]),
                      runtime=Runtime(device="cpu", threads=2, checkpoint_every=5))
    path = write_parquet(_frame(), tmp_path / "sub" / "x.parquet", prov)
    back = read_parquet(path)
    pd.testing.assert_frame_equal(back, _frame())
    meta = read_provenance(path)
    assert meta["rule"] == "simulate_affine_limit"
    assert meta["params"] == {"affine_limit": {"n_prompts": 7, "prompt_lengths": [10, 100]}, "seed": 42}
    # two seed keys with distinct names: the base seed of every stream, and the training seeds of the runs
    assert meta["base_seed"] == 42 and meta["run_seeds"] == [3, 1] and "seed" not in meta
    assert meta["runtime"] == {"device": "cpu", "threads": 2, "checkpoint_every": 5, "resolved_device": "cpu"}
    assert {"numpy", "torch", "pyarrow", "python", "largeprompt"} <= set(meta["versions"])
    assert meta["git_commit"]


def test_a_table_written_before_a_rename_reads_under_todays_names(tmp_path):
    """A table whose column still has its old name (LEGACY_COLUMNS: ``measure``) reads as ``token_measure``, also
    when the reader selects or filters by the new name; a table with both names is read as it is."""
    old = _frame().rename(columns={"token_measure": "measure"})
    old.loc[2, "measure"] = "uniform"
    path = write_parquet(old, tmp_path / "old.parquet", provenance("r", {}))
    back = read_parquet(path)
    assert "measure" not in back and list(back["token_measure"]) == ["gaussian", "gaussian", "uniform"]
    picked = read_parquet(path, columns=["token_measure", "error"], filters=[("token_measure", "==", "uniform")])
    assert list(picked.columns) == ["token_measure", "error"] and list(picked["token_measure"]) == ["uniform"]
    nested = read_parquet(path, filters=[[("token_measure", "==", "gaussian"), ("prompt_length", ">", 10)]])
    assert list(nested["prompt_length"]) == [100]
    assert distinct_keys(path, ["token_measure"]) == [("gaussian",), ("uniform",)]
    both = write_parquet(old.assign(token_measure="x"), tmp_path / "both.parquet", provenance("r", {}))
    assert set(read_parquet(both)[["measure", "token_measure"]].columns) == {"measure", "token_measure"}


def test_provenance_without_seeds_or_runtime():
    meta = provenance("collect_concentration_errors", {})
    assert meta["base_seed"] is None and "run_seeds" not in meta and "runtime" not in meta
    with pytest.raises(TypeError):
        provenance("r", {}, 1)  # the seeds are keyword-only: a bare number cannot land in the wrong key
    assert provenance("r", {}, runtime=Runtime(device="auto"))["runtime"]["resolved_device"] == str(resolve_device("auto"))


def test_same_data_gives_identical_bytes(tmp_path):
    prov = provenance("r", {"a": 1}, base_seed=1)
    a = write_parquet(_frame(), tmp_path / "a.parquet", prov)
    b = write_parquet(_frame(), tmp_path / "b.parquet", prov)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("parts", [1, 3])
def test_killed_write_leaves_no_file(tmp_path, monkeypatch, parts):
    """Killed while writing the last part (of one, or of three written one at a time): no file, no temporary."""
    target = tmp_path / "out.parquet"
    real_writer = parquet_io.pq.ParquetWriter

    class KilledWriter(real_writer):
        written = 0

        def write_table(self, table, *args, **kwargs):
            KilledWriter.written += 1
            if KilledWriter.written == parts:
                raise KeyboardInterrupt("killed mid-write")
            super().write_table(table, *args, **kwargs)

    monkeypatch.setattr(parquet_io.pq, "ParquetWriter", KilledWriter)
    with pytest.raises(KeyboardInterrupt):
        if parts == 1:
            write_parquet(_frame(), target, {"rule": "r"})
        else:
            parquet_io.write_parquet_parts([_frame()] * parts, target, {"rule": "r"})
    assert KilledWriter.written == parts
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_parts_are_written_as_their_concatenation(tmp_path):
    frames = [_frame().assign(part=k) for k in range(3)]
    parquet_io.write_parquet_parts(iter(frames), tmp_path / "parts.parquet", {"rule": "r", "seed": 1})
    pd.testing.assert_frame_equal(read_parquet(tmp_path / "parts.parquet"), pd.concat(frames, ignore_index=True))
    assert read_provenance(tmp_path / "parts.parquet") == {"rule": "r", "seed": 1}


def test_missing_file_names_the_rule_that_makes_it(tmp_path, in_a_job):
    missing = tmp_path / "results" / "smoke" / "affine_limit" / "queries.parquet"
    with pytest.raises(ResultFileError, match=r"no such result file; made by rule 'make_affine_limit_queries'; rebuild it "
                                              r"with: snakemake --cores 2 --force results/smoke/affine_limit/queries\.parquet"):
        read_parquet(missing)
    with pytest.raises(ResultFileError, match="no such result file") as err:
        read_provenance(tmp_path / "elsewhere.parquet")
    assert "made by rule" not in str(err.value)  # outside results/<run>/: no producer to name


def test_corrupt_and_foreign_files_are_reported(tmp_path, in_a_job):
    bad = tmp_path / "results" / "default" / "affine_limit" / "outputs.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(ResultFileError, match="not a readable Parquet file.*made by rule 'simulate_affine_limit'"):
        read_parquet(bad)
    with pytest.raises(ResultFileError, match="simulate_affine_limit"):
        read_provenance(bad)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(__import__("pyarrow").Table.from_pandas(_frame()), foreign)
    with pytest.raises(ResultFileError, match="provenance"):
        read_provenance(foreign)


def _inspect(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "largeprompt.commands.cli", "inspect", *args], capture_output=True, text=True, cwd=cwd)


def test_inspect_prints_provenance_schema_and_rows(tmp_path):
    path = write_parquet(_frame(), tmp_path / "x.parquet", provenance("rule_x", {"n_prompts": 123}, base_seed=9))
    proc = _inspect(str(path), "--rows", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert '"rule": "rule_x"' in out and '"n_prompts": 123' in out and '"base_seed": 9' in out
    assert "prompt_length: int64" in out and "error: double" in out
    assert "rows: 3" in out and "first 2 rows" in out


def test_inspect_errors_are_clear(tmp_path, monkeypatch):
    """Outside a checkout Snakemake has parsed, the message names the file and the command; in one, also the rule
    (from .snakemake/largeprompt_producers.json, written by the Snakefile)."""
    monkeypatch.setenv(PRODUCERS_ENV, "")  # not in a job; share_producers below sets it, the fixture restores it
    missing = tmp_path / "results/default/train/L10.parquet"
    proc = _inspect(str(missing), cwd=tmp_path)
    assert proc.returncode == 2 and "no such result file" in proc.stderr, proc.stderr
    assert "--force results/default/train/L10.parquet" in proc.stderr and "made by rule" not in proc.stderr
    rules = workflow_rules()
    share_producers(((r.name, list(r.outputs)) for r in rules.values()), workdir=tmp_path)
    monkeypatch.setenv(PRODUCERS_ENV, "")  # the saved file alone
    proc = _inspect(str(missing), cwd=tmp_path)
    assert proc.returncode == 2 and "made by rule 'train'" in proc.stderr, proc.stderr
    corrupt = tmp_path / "c.parquet"
    corrupt.write_bytes(b"\x00garbage")
    proc = _inspect(str(corrupt), cwd=tmp_path)
    assert proc.returncode == 2 and "not a readable Parquet file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_parquet_output_of_the_workflow_has_a_producing_rule(in_a_job):
    """In a job, producing_rule names, for every Parquet output of the rules (results/<run>/…), the rule that declares it."""
    import re

    checked = 0
    for rule in in_a_job.values():
        for path in rule.outputs:
            if path.startswith("results/") and path.endswith(".parquet"):
                concrete = re.sub(r"\{[^}]+\}", "0", path)
                assert parquet_io.producing_rule(concrete) == rule.name, (path, rule.name)
                assert parquet_io.producing_rule("/elsewhere/" + concrete.replace("/default/", "/smoke/", 1)) == rule.name
                checked += 1
    assert checked >= 25
