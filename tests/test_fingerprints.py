"""Reruns follow the code a rule runs, definition by definition (docs/architecture.md#fingerprints): the static
reach of each rule, the rerun table kept in the docs, and Snakemake's own rerun decisions on the smoke run."""
import re
import shutil

import pandas as pd
import pytest

from helpers import REPO, run, snakemake_cmd
from largeprompt.io.fingerprints import is_plumbing, markdown_table, parse_module, reached, rerun_table

SCRIPTS = REPO / "workflow" / "scripts"
TABLE_START = "<!-- rerun table: python -m largeprompt.io.fingerprints -->"


def test_a_rule_reaches_only_the_code_it_runs():
    rates = reached(SCRIPTS / "estimate_concentration_rates.py")
    assert "largeprompt.maths.rate_tables" in rates and "largeprompt.stages.simulate_concentration_errors" not in rates
    assert not any(m.startswith(("largeprompt.kernel", "largeprompt.maths.attention")) for m in rates)
    flow = reached(SCRIPTS / "full_model_flow.py")
    assert "largeprompt.icl.full_model_risk" in flow and "largeprompt.icl.engine.stacked" not in flow  # flows use no SGD
    assert reached(SCRIPTS / "train.py")["largeprompt.icl.engine.runs"] >= {"initial_parameters", "whitened_batch"}
    for script in SCRIPTS.glob("*.py"):
        modules = reached(script)
        assert not any(is_plumbing(m) for m in modules), script.name  # logs, Parquet, provenance never count
        if script.stem.startswith("plot_"):
            assert all(m.startswith(("largeprompt.plots", "workflow.")) for m in modules), script.name


def test_the_c_code_a_module_compiles_counts_as_its_source_constant(tmp_path):
    """The native readout's C text is part of C_SOURCE's definition, so editing it reruns the training rules."""
    assert "C_SOURCE" in reached(SCRIPTS / "train.py")["largeprompt.icl.engine.native_step"]
    kernel = REPO / "src" / "largeprompt" / "icl" / "engine"
    shutil.copy(kernel / "native_step.py", tmp_path / "native.py")
    (tmp_path / "stacked_readout.c").write_text((kernel / "stacked_readout.c").read_text())
    before = parse_module("copy.before", tmp_path / "native.py").units  # parse_module is cached per (name, path)
    (tmp_path / "stacked_readout.c").write_text((kernel / "stacked_readout.c").read_text() + "\n/* edited */\n")
    after = parse_module("copy.after", tmp_path / "native.py").units
    assert after["C_SOURCE"] != before["C_SOURCE"] and {n: u for n, u in after.items() if n != "C_SOURCE"} == \
        {n: u for n, u in before.items() if n != "C_SOURCE"}


def test_the_rerun_table_in_the_docs_is_current():
    """docs/architecture.md carries the table the code computes; regenerate it with the command in its comment."""
    text = (REPO / "docs" / "architecture.md").read_text()
    assert TABLE_START in text, "docs/architecture.md lost its rerun table"
    assert markdown_table(SCRIPTS) in text, "the rerun table in docs/architecture.md is stale: regenerate it"


def docs_table() -> dict[str, set[str]]:
    """module file → rules, as printed in docs/architecture.md."""
    text = (REPO / "docs" / "architecture.md").read_text().split(TABLE_START, 1)[1]
    rows = re.findall(r"^\| `(largeprompt/[^`]+)` \| (.*) \|$", text, flags=re.M)
    return {path: set(re.findall(r"`(\w+)`", rules)) for path, rules in rows}


def changed_rules(work) -> set[str]:
    """The rules whose params (the code fingerprints) changed since their files were made: Snakemake's
    ``--summary`` status per output file (a dry run's reasons stop at "input files updated" for jobs downstream)."""
    proc = run(snakemake_cmd("--summary", "--configfile", "config/smoke.yaml"), cwd=work)
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    header = rows[0]
    rule, status = header.index("rule"), header.index("status")
    return {row[rule] for row in rows[1:] if len(row) > status and row[status] == "params changed"}


@pytest.fixture(scope="module")
def edited_copy(smoke_run, tmp_path_factory):
    """A private copy of the built smoke run (results and Snakemake's records included), safe to edit."""
    work, _, _ = smoke_run
    copy = tmp_path_factory.mktemp("fingerprints") / "repo"
    shutil.copytree(work, copy, symlinks=True)
    return copy


def _edited_modules(src, expected):
    """The module files an edit can rerun rules of: all but the bench, entry points and reports (reached by no rule,
    and outside the layers the rules import)."""
    return {src / path: rules for path, rules in expected.items()
            if not (path.startswith("largeprompt/bench") or path.endswith(("__init__.py", "cli.py", "report.py")))}


@pytest.mark.slow
def test_editing_each_module_reruns_exactly_its_row_of_the_table(edited_copy):
    """A statement added to a module runs whenever any of its definitions is used, so every rule that reaches the
    module reruns, and no other; a new unused definition reruns nothing (added to every module at once: one
    Snakemake call); plumbing reruns nothing."""
    expected = docs_table()
    assert expected == {path: set(rules) for path, rules in rerun_table(SCRIPTS).items()}
    modules = _edited_modules(edited_copy / "src", expected)
    originals = {module: module.read_text() for module in modules}
    assert changed_rules(edited_copy) == set()
    try:
        for module, original in originals.items():
            module.write_text(original + "\n_UNUSED_DEFINITION = 1\n")
        assert changed_rules(edited_copy) == set(), "an unused definition reran rules"
        for module, original in originals.items():
            module.write_text(original)
        for module, rules in modules.items():
            module.write_text(originals[module] + "\npass\n")
            try:
                assert changed_rules(edited_copy) == rules, module.relative_to(edited_copy / "src")
            finally:
                module.write_text(originals[module])
    finally:
        for module, original in originals.items():
            module.write_text(original)


@pytest.mark.slow
def test_a_plumbing_edit_changes_no_number(edited_copy):
    """Edit the progress bars and the Parquet writer's bookkeeping, force two stages to rerun, get the same data."""
    results = edited_copy / "results" / "smoke"
    targets = [results / "affine_limit" / "outputs.parquet", results / "train" / "training_runs.parquet"]
    before = [pd.read_parquet(t) for t in targets]
    runlog = edited_copy / "src" / "largeprompt" / "io" / "runlog.py"
    original = runlog.read_text()
    runlog.write_text(original.replace("ncols=100", "ncols=80"))
    try:
        assert changed_rules(edited_copy) == set()
        run(snakemake_cmd("--cores", "2", "--configfile", "config/smoke.yaml", "--forcerun", "simulate_affine_limit",
                          "summarize_training", "--allowed-rules", "simulate_affine_limit", "summarize_training"),
            cwd=edited_copy, timeout=600)
    finally:
        runlog.write_text(original)
    for target, frame in zip(targets, before):
        pd.testing.assert_frame_equal(pd.read_parquet(target), frame, check_exact=True, obj=target.name)


def test_the_parse_cache_follows_the_text(tmp_path, monkeypatch):
    """A module parsed once is read back from the on-disk cache with the same units; an edit of its text is parsed
    afresh (the cache is keyed by content, never by time)."""
    from largeprompt.io import fingerprints as fp

    monkeypatch.setattr(fp, "CACHE_DIR", tmp_path / "cache")
    script = tmp_path / "probe.py"
    script.write_text("def f():\n    return 1\n")
    first = fp.parse_module.__wrapped__("workflow.scripts.probe", script)
    assert len(list((tmp_path / "cache").glob("*.pickle"))) == 1
    again = fp.parse_module.__wrapped__("workflow.scripts.probe", script)
    assert again.units == first.units
    script.write_text("def f():\n    return 2\n")
    edited = fp.parse_module.__wrapped__("workflow.scripts.probe", script)
    assert edited.units["f"] != first.units["f"]
    assert len(list((tmp_path / "cache").glob("*.pickle"))) == 2


def test_fingerprints_are_keyed_by_definition_so_a_move_reruns_nothing():
    """fingerprint_entries: one entry per definition name; moving a definition unchanged to another module keeps
    every entry; editing it changes its entry alone; a module's other statements are keyed by its file; a script's
    text is one entry; two same-named definitions share one entry that changes with either."""
    from largeprompt.io.fingerprints import PREAMBLE, fingerprint_entries

    before = {"largeprompt/a.py": {"f": "dump-f", "g": "dump-g", PREAMBLE: "use()"}, "largeprompt/b.py": {"h": "dump-h"},
              "workflow/scripts/x.py": {"run": "dump-run", PREAMBLE: "main()"}}
    moved = {"largeprompt/a.py": {"g": "dump-g", PREAMBLE: "use()"}, "largeprompt/b.py": {"h": "dump-h", "f": "dump-f"},
             "workflow/scripts/x.py": {"run": "dump-run", PREAMBLE: "main()"}}
    entries = fingerprint_entries(before)
    assert set(entries) == {"f", "g", "h", "largeprompt/a.py", "workflow/scripts/x.py"}
    assert fingerprint_entries(moved) == entries
    edited = fingerprint_entries({**before, "largeprompt/b.py": {"h": "dump-h2"}})
    assert {k for k in entries if edited[k] != entries[k]} == {"h"}
    twice = fingerprint_entries({**before, "largeprompt/b.py": {"h": "dump-h", "f": "other-f"}})
    assert set(twice) == set(entries) and twice["f"] != entries["f"]
