"""Fuzzing the config validation (docs/reliability.md#config-fuzzing): every leaf of config/config.yaml gets a wrong
type, a value outside its range, NaN, ±inf, null and an empty list; keys are misspelt and sections replaced by scalars;
the constraints between keys are broken one at a time. Every mutation is refused by the validation layer with lines that
name the key, and never with another exception. The slow tier runs a sample through ``snakemake -n``, and every range's
minimum and maximum through it too, which must pass."""
from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from largeprompt.io.config import ConfigError, check_config, load_schema

REPO = Path(__file__).resolve().parents[1]
SCHEMA_PATH = REPO / "workflow" / "schemas" / "config.schema.yaml"
SCHEMA = load_schema(SCHEMA_PATH)
BASE = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def leaves(node, schema, path=()):
    """(path, value, schema node) of every leaf of the config (a list of numbers counts as a leaf)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, schema.get("properties", {}).get(key, {}), (*path, key))
    else:
        yield path, node, schema


def out_of_range(schema: dict) -> list:
    node = schema.get("items", schema) if schema.get("type") == "array" else schema
    wrap = (lambda v: [v]) if schema.get("type") == "array" else (lambda v: v)
    values = []
    if "minimum" in node:
        values.append(wrap(node["minimum"] - 1))
    if "exclusiveMinimum" in node:
        values.append(wrap(node["exclusiveMinimum"]))
    if "maximum" in node:
        values.append(wrap(node["maximum"] + 1))
    if "exclusiveMaximum" in node:
        values.append(wrap(node["exclusiveMaximum"]))
    if "enum" in node:
        values.append(wrap("no-such-value"))
    return values


def mutations():
    """(name, dotted key that must be named, mutated config) for every leaf and every kind of mutation."""
    for path, _value, schema in leaves(BASE, SCHEMA):
        key = ".".join(path)
        kind = schema.get("type")
        bad = {"wrong type": [1, 2] if kind in ("number", "integer", "string", "boolean") else "text",
               "null": None, "NaN": math.nan, "+inf": math.inf, "-inf": -math.inf}
        if kind != "array" or schema.get("minItems", 0) > 0:
            bad["empty list"] = []
        if kind == "array" and schema.get("items", {}).get("type") in ("number", "integer"):
            bad["NaN item"] = [math.nan]
        if kind == "integer":
            bad["fraction"] = 1.5
        for i, v in enumerate(out_of_range(schema)):
            bad[f"out of range {i}"] = v
        if kind == "string" and "pattern" in schema:
            bad["bad pattern"] = "../escape"
        for name, v in bad.items():
            yield f"{key}: {name}", key, _set(path, v)
    for section, node in BASE.items():
        if isinstance(node, dict):
            yield f"{section}: replaced by a scalar", section, _set((section,), 3)
            first = next(iter(node))
            yield f"{section}.{first}: misspelt", section, _rename((section, first), first + "x")
    yield "misspelt top-level key", "sead", _rename(("seed",), "sead")


def _set(path, value) -> dict:
    config = copy.deepcopy(BASE)
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return config


def _rename(path, new) -> dict:
    config = copy.deepcopy(BASE)
    node = config
    for key in path[:-1]:
        node = node[key]
    node[new] = node.pop(path[-1])
    return config


CROSS_KEY = [
    ("train.decay_start", {"train": {"decay_start": 0.8, "decay_end": 0.6}}),
    ("train.final_lr", {"train": {"final_lr": 0.5, "lr": 0.01}}),
    ("train.replicate_seeds", {"train": {"replicate_seeds": [99]}}),
    ("beyond_gaussian.trajectory_transfer.replicate_seeds", {"beyond_gaussian": {"trajectory_transfer": {"replicate_seeds": [99]}}}),
    ("icl.covariance_rho", {"icl": {"token_measure": "uniform"}}),
    ("init_dependence.n_folds", {"init_dependence": {"n_folds": 10, "n_seeds": 8}}),
    ("concentration.log2_max_prompt_length", {"concentration": {"log2_min_prompt_length": 10, "log2_max_prompt_length": 11}}),
    ("fixed_query_bound.repetition_block", {"fixed_query_bound": {"repetition_block": 5000, "n_repetitions": 100}}),
    ("affine_limit.gaussian_mean", {"affine_limit": {"gaussian_mean": [0.0, 0.0]}}),
]


def _overlay(overlay: dict) -> dict:
    config = copy.deepcopy(BASE)

    def merge(base, over):
        for k, v in over.items():
            if isinstance(v, dict):
                merge(base.setdefault(k, {}), v)
            else:
                base[k] = v

    merge(config, overlay)
    return config


def refusal(config: dict) -> list[str]:
    """The lines of the ConfigError the config gets ([] if it passes); any other exception fails the test."""
    try:
        check_config(copy.deepcopy(config), SCHEMA_PATH)
    except ConfigError as err:
        return [line[4:] for line in str(err).splitlines() if line.startswith("  - ")]
    return []


MUTATIONS = list(mutations())


def test_the_fuzz_covers_hundreds_of_mutations():
    assert len(MUTATIONS) > 300


@pytest.mark.parametrize("name, key, config", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_every_mutation_is_refused_naming_its_key(name, key, config):
    lines = refusal(config)
    assert lines, f"{name}: accepted"
    assert any(key in line for line in lines), (name, lines)  # one line names the key (a misspelling also says it is missing)
    assert all(line.startswith("config key") for line in lines), (name, lines)


@pytest.mark.parametrize("key, overlay", CROSS_KEY, ids=[c[0] for c in CROSS_KEY])
def test_contradicting_keys_are_refused_naming_them(key, overlay):
    lines = refusal(_overlay(overlay))
    assert len(lines) == 1 and key in lines[0], lines


def test_the_shipped_configs_pass():
    for name in ("smoke", "paper"):
        assert refusal(_overlay(yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text()))) == []
    assert refusal(BASE) == []


def edge_values():
    """(key, value) for every bound of every numeric leaf that the schema accepts (minimum, maximum), the ones that
    pass the cross-key rules with the rest of the default config."""
    for path, _, schema in leaves(BASE, SCHEMA):
        node = schema.get("items", schema) if schema.get("type") == "array" else schema
        for bound in ("minimum", "maximum"):
            if bound in node:
                value = [node[bound]] if schema.get("type") == "array" else node[bound]
                config = _set(path, value)
                if not refusal(config):
                    yield ".".join(path), value, config


EDGES = list(edge_values())


def test_edge_values_pass_validation():
    assert len(EDGES) > 40


def _snakemake_n(config: dict, tmp_path: Path):
    overlay = tmp_path / "overlay.yaml"
    own = config.get("run") == BASE["run"]  # a dry run under its own name (a mutated run name is what is tested)
    overlay.write_text(yaml.safe_dump({**config, "run": "fuzz"} if own else config))
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(overlay)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("key, overlay", CROSS_KEY[:3], ids=[c[0] for c in CROSS_KEY[:3]])
def test_snakemake_refuses_the_contradictions_by_name(key, overlay, tmp_path):
    proc = _snakemake_n(_overlay(overlay), tmp_path)
    assert proc.returncode != 0 and key in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("index", range(0, len(MUTATIONS), max(1, len(MUTATIONS) // 6)))
def test_snakemake_refuses_a_sample_of_mutations(index, tmp_path):
    name, key, config = MUTATIONS[index]
    proc = _snakemake_n(config, tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text and "invalid configuration" in text, (name, text[-2000:])


@pytest.mark.slow
def test_every_edge_value_gets_through_a_dry_run(tmp_path):
    """One dry run per bound would take minutes: the edges are grouped so that each dry run sets one bound of many
    keys at once (a group whose keys contradict each other is split)."""
    failures = []
    for group in (EDGES[i::6] for i in range(6)):
        config = copy.deepcopy(BASE)
        for key, value, _ in group:
            node = config
            *parents, last = key.split(".")
            for p in parents:
                node = node[p]
            node[last] = value
        if refusal(config):  # these bounds contradict each other together: try them one by one
            runs = [(key, c) for key, _, c in group]
        else:
            runs = [(",".join(k for k, _, _ in group), config)]
        for keys, c in runs:
            proc = _snakemake_n(c, tmp_path)
            if proc.returncode != 0:
                failures.append((keys, (proc.stdout + proc.stderr)[-1500:]))
    assert not failures, failures
