"""Config validation: every invalid value is named with its allowed range (docs/experiments.md#configurations)."""
import copy

import pytest
import yaml

from helpers import REPO, copy_repo, run, snakemake_cmd
from largeprompt.io.config import DEPRECATION, ConfigError, check_config, migrate_deprecated, renamed_message

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
        (("affine_limit", "token_measures"), ["gaussian", "cauchy"], r"'affine_limit.token_measures\[1\]' = \"cauchy\""),
        (("affine_limit", "gaussian_mean"), [0.0, 0.0], r"'affine_limit.gaussian_mean' has 2 entries"),
        (("concentration", "log2_max_prompt_length"), 5, r"'concentration.log2_max_prompt_length' = 5: the L grid needs"),
        (("fixed_query_bound", "log2_max_prompt_length"), 5, r"'fixed_query_bound.log2_max_prompt_length' = 5: the L grid"),
        (("concentration", "repetition_block"), 10**6, r"'concentration.repetition_block' = 1000000 exceeds"),
        (("fixed_query_bound", "repetition_block"), 10**6, r"'fixed_query_bound.repetition_block' = 1000000 exceeds"),
        (("train", "lr"), -0.1, r"'train.lr' = -0.1"),
        (("train", "replicate_seeds"), [20], r"'train.replicate_seeds' = \[20\] names seeds that are not in"),
        (("train", "seeds"), [0, 1, 1], r"'train.seeds' = \[0, 1, 1\].*non-unique.*no repeats"),
        (("train", "seeds"), [0, -1], r"'train.seeds\[1\]' = -1.*allowed: integer in \[0, 4294967295\]"),
        (("init_dependence", "n_seeds"), 4, r"'init_dependence.n_seeds' = 4.*allowed: integer in \[8, 100000\]"),
        (("train", "trapped_loss_ratio", "softmax"), 0.9, r"'train.trapped_loss_ratio.softmax' = 0.9.*\[1, 100\]"),
        (("run",), "../elsewhere", r"config key 'run' = \"../elsewhere\": the run name becomes a folder.*no '/' and no '..'"),
        (("run",), "a/b", r"config key 'run' = \"a/b\""),
        (("run",), "a..b", r"config key 'run' = \"a..b\""),
        (("run",), ".hidden", r"config key 'run' = \".hidden\""),
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


def test_a_bad_run_name_is_one_line():
    config = _default()
    config["run"] = "../elsewhere"  # breaks both the pattern and the '..' rule of the schema
    with pytest.raises(ConfigError) as err:
        check_config(config, SCHEMA)
    assert str(err.value).count("config key 'run'") == 1


def test_unknown_and_missing_keys_are_named():
    config = _default()
    config["affine_limit"]["n_prompt"] = 3  # typo
    with pytest.raises(ConfigError, match=r"under 'affine_limit': unknown key 'n_prompt' \(did you mean 'n_prompts'\?\)"):
        check_config(config, SCHEMA)
    config = _default()
    config["trian"] = {}  # typo at the top level
    with pytest.raises(ConfigError, match=r"at the top level: unknown key 'trian' \(did you mean 'train'\?\)"):
        check_config(config, SCHEMA)
    config = _default()
    del config["affine_limit"]["chunk_size"]
    with pytest.raises(ConfigError, match=r"'affine_limit.chunk_size' is missing"):
        check_config(config, SCHEMA)


def test_the_deprecated_bounds_section_is_read_as_its_new_sections():
    """``bounds`` (this release split it) still works, once, with a message naming the new keys."""
    config, messages = _default(), []
    old = {"n_bootstrap": 60, "chunk_size": 4096, "ci_level": 0.9, "fixed_query": {"deltas": [0.1, 0.02]}}
    config["bounds"] = copy.deepcopy(old)
    assert migrate_deprecated(config, warn=messages.append)
    assert messages == [DEPRECATION] and "'concentration'" in DEPRECATION and "'fixed_query_bound'" in DEPRECATION
    assert "bounds" not in config
    assert config["concentration"]["n_bootstrap"] == 60 and config["concentration"]["chunk_size"] == 4096
    assert config["fixed_query_bound"]["deltas"] == [0.1, 0.02]
    assert config["fixed_query_bound"]["chunk_size"] == 4096 and config["fixed_query_bound"]["ci_level"] == 0.9  # shared keys
    assert config["concentration"]["c_values"] == _default()["concentration"]["c_values"]  # the rest untouched
    check_config(config, SCHEMA)
    assert not migrate_deprecated(config, warn=messages.append) and len(messages) == 1  # nothing left to move


def test_the_old_transfer_sections_are_read_as_trajectory_transfer():
    """R4's old config sections ``transfer`` and ``beyond_gaussian.transfer`` still work, once each, merged into
    ``trajectory_transfer`` (the old file's keys win, the defaults keep the rest), with a message naming the new key."""
    config, messages = _default(), []
    config["transfer"] = {"lr": 0.02, "seeds": [0, 1]}
    config["beyond_gaussian"]["transfer"] = {"batch_size": 512}
    assert migrate_deprecated(config, warn=messages.append)
    assert len(messages) == 2 and "'trajectory_transfer'" in messages[0] and "'transfer'" in messages[0]
    assert "'beyond_gaussian.trajectory_transfer'" in messages[1]
    assert "transfer" not in config and "transfer" not in config["beyond_gaussian"]
    section, default = config["trajectory_transfer"], _default()["trajectory_transfer"]
    assert section["lr"] == 0.02 and section["seeds"] == [0, 1] and section["horizon"] == default["horizon"]
    assert config["beyond_gaussian"]["trajectory_transfer"]["batch_size"] == 512
    check_config(config, SCHEMA)
    assert not migrate_deprecated(config, warn=messages.append) and len(messages) == 2


@pytest.mark.parametrize("section", ["concentration", "affine_limit"])
def test_a_renamed_key_is_read_under_its_new_name(section):
    """``<section>.measures`` (renamed ``token_measures``) still works, once, with a message naming the new key; a
    file that still uses the old name is overlaid on defaults with the new one, so the old name's value wins."""
    config, messages = _default(), []
    config[section]["measures"] = ["uniform"]
    assert migrate_deprecated(config, warn=messages.append)
    assert messages == [renamed_message(section, "measures", "token_measures")]
    assert f"'{section}.token_measures'" in messages[0] and f"'{section}.measures'" in messages[0]
    assert config[section]["token_measures"] == ["uniform"] and "measures" not in config[section]
    check_config(config, SCHEMA)
    assert not migrate_deprecated(config, warn=messages.append) and len(messages) == 1


def test_snakemake_refuses_invalid_config_before_any_job(tmp_path):
    work = copy_repo(tmp_path / "repo")
    bad = work / "config" / "bad.yaml"
    bad.write_text(yaml.safe_dump({"affine_limit": {"n_prompts": 1}}))
    proc = run(snakemake_cmd("--cores", "1", "--configfile", str(bad)), cwd=work, check=False)
    assert proc.returncode != 0
    message = proc.stdout + proc.stderr
    assert "'affine_limit.n_prompts' = 1" in message and "[2, 1000000]" in message
    assert not (work / "results").exists() or not any((work / "results").rglob("*.parquet"))


def test_numbers_in_scientific_notation_are_read_as_numbers():
    """YAML 1.1 reads `1e-3` as a string; the config reads it as the number people mean."""
    config = _default()
    overlay = yaml.safe_load("train:\n  lr: 1e-3\n  final_lr: 1e-4\n  divergence_threshold: 1e4\ntrajectory_transfer:\n  batch_size: 1e3\n")
    assert isinstance(overlay["train"]["lr"], str)  # the YAML 1.1 behaviour this guards against
    for section, values in overlay.items():
        config[section].update(values)
    check_config(config, SCHEMA)
    assert config["train"]["lr"] == 0.001 and config["trajectory_transfer"]["batch_size"] == 1000
    assert isinstance(config["trajectory_transfer"]["batch_size"], int)
    config["train"]["lr"] = "fast"
    with pytest.raises(ConfigError, match=r"'train.lr' = \"fast\""):
        check_config(config, SCHEMA)


def test_snakemake_accepts_scientific_notation(tmp_path):
    work = copy_repo(tmp_path / "repo")
    overlay = work / "config" / "sci.yaml"
    overlay.write_text("run: sci\ntrain:\n  lr: 1e-1\n")
    proc = run(snakemake_cmd("-n", "--configfile", str(overlay)), cwd=work)  # raises if the schema refused it
    assert "results/sci/train/L10.parquet" in proc.stdout + proc.stderr
