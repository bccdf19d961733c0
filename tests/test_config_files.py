"""Config files as a user writes them (src/largeprompt/io/config.py, read_config_file and check_config_files, behind
`largeprompt check-config`): a missing, empty or malformed overlay is one line naming the file, and the YAML line where
there is one; and the hint `snakemake --report` prints for a run without figures (io.pipeline.report_hint)."""
import pytest

from helpers import REPO
from largeprompt.commands.cli import main
from largeprompt.io.config import ConfigError, check_config_files, read_config_file
from largeprompt.io.pipeline import report_hint

BASE, SCHEMA = REPO / "config" / "config.yaml", REPO / "workflow" / "schemas" / "config.schema.yaml"


@pytest.mark.parametrize("text, expected", [
    (None, "not found"),
    ("# only a comment\n", "is empty (or only comments)"),
    ("train:\n  lr: 0.1\n   horizon: 3\n", "line 3, column 11: not valid YAML"),
    ("- a\n- b\n", "holds a list, not keys"),
])
def test_a_bad_overlay_is_one_line_naming_the_file(tmp_path, text, expected):
    path = tmp_path / "overlay.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_config_file(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and expected in message, message


def test_check_config_merges_overlays_and_names_a_bad_key(tmp_path, capsys):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("run: my-run\ntrain:\n  lr: 0.1\n")
    bad.write_text("run: ../escape\n")
    check_config_files([good], BASE, SCHEMA)
    with pytest.raises(ConfigError, match=r"config key 'run' = \"../escape\""):
        check_config_files([good, bad], BASE, SCHEMA)
    assert main(["check-config", str(REPO / "config" / "smoke.yaml")]) == 0
    assert main(["check-config", str(bad)]) == 2
    assert capsys.readouterr().err.count("config key 'run'") == 1  # each problem printed once


def test_report_hint_names_the_missing_figures_and_the_runs_that_have_them(tmp_path):
    (tmp_path / "figures" / "smoke").mkdir(parents=True)
    (tmp_path / "figures" / "smoke" / "a.png").write_bytes(b"png")
    (tmp_path / "figures" / "full").mkdir()
    for name in ("a", "b"):
        (tmp_path / "figures" / "full" / f"{name}.png").write_bytes(b"png")
    assert report_hint("full", ["a", "b"], root=tmp_path) is None
    hint = report_hint("default", ["a", "b"], root=tmp_path)
    assert "figures/default/ lacks 2 of its 2 figures" in hint and "--configfile" in hint
    assert "figures exist for: full, smoke" in hint
