"""Config validation: every invalid value is named with its allowed range (SPEC §3.3, §5)."""
import copy

import pytest
import yaml

from largeprompt.config import ConfigError, check_config

from conftest import REPO, copy_repo, run, snakemake_cmd

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def _default():
    with open(REPO / "config" / "config.yaml") as fh:
        return yaml.safe_load(fh)


def _merged(overlay):
    base = _default()

    def merge(a, b):
        for k, v in b.items():
            if isinstance(v, dict) and isinstance(a.get(k), dict):
                merge(a[k], v)
            else:
                a[k] = v

    with open(REPO / "config" / overlay) as fh:
        merge(base, yaml.safe_load(fh) or {})
    return base


@pytest.mark.parametrize("overlay", [None, "smoke.yaml", "paper.yaml"])
def test_shipped_configs_are_valid(overlay):
    check_config(_default() if overlay is None else _merged(overlay), SCHEMA)


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("affine_limit", "n_prompts"), 0, r"'affine_limit.n_prompts' = 0: .*allowed: integer in \[2, 1000000\]"),
        (("affine_limit", "n_prompts"), "many", r"'affine_limit.n_prompts' = \"many\""),
        (("seed",), -1, r"'seed' = -1.*allowed: integer in \[0, 4294967295\]"),
        (("dtype",), "float16", r"'dtype' = \"float16\".*one of \"float64\", \"float32\""),
        (("device",), "tpu", r"'device' = \"tpu\".*one of \"auto\", \"cpu\", \"cuda\""),
        (("affine_limit", "ray", "t_max"), 0, r"'affine_limit.ray.t_max' = 0.*allowed: number in \(0, 20\]"),
        (("affine_limit", "measures"), ["gaussian", "cauchy"], r"'affine_limit.measures\[1\]' = \"cauchy\""),
        (("affine_limit", "gaussian_mean"), [0.0, 0.0], r"'affine_limit.gaussian_mean' has 2 entries"),
        (("bounds", "log2_max_prompt_length"), 5, r"'bounds.log2_max_prompt_length' = 5: the L grid needs"),
        (("bounds", "fixed_query", "repetition_block"), 10**6, r"'bounds.fixed_query.repetition_block' = 1000000 exceeds"),
        (("train", "lr"), -0.1, r"'train.lr' = -0.1"),
    ],
)
def test_invalid_values_name_the_key_and_range(path, value, expected):
    config = copy.deepcopy(_default())
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ConfigError, match=expected):
        check_config(config, SCHEMA)


def test_unknown_and_missing_keys_are_named():
    config = _default()
    config["affine_limit"]["n_prompt"] = 3  # typo
    with pytest.raises(ConfigError, match=r"affine_limit.*'n_prompt' was unexpected"):
        check_config(config, SCHEMA)
    config = _default()
    del config["affine_limit"]["chunk_size"]
    with pytest.raises(ConfigError, match=r"'affine_limit.chunk_size' is missing"):
        check_config(config, SCHEMA)


def test_snakemake_refuses_invalid_config_before_any_job(tmp_path):
    work = copy_repo(tmp_path / "repo")
    bad = work / "config" / "bad.yaml"
    bad.write_text(yaml.safe_dump({"affine_limit": {"n_prompts": 1}}))
    proc = run(snakemake_cmd("--cores", "1", "--configfile", str(bad)), cwd=work, check=False)
    assert proc.returncode != 0
    message = proc.stdout + proc.stderr
    assert "'affine_limit.n_prompts' = 1" in message and "[2, 1000000]" in message
    assert not (work / "results" / "data").exists()
