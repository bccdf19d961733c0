"""What the Snakemake rules need from the library: config settings as params, the code each rule
depends on, and the run-time keys that never change a result.

* :func:`settings` turns config keys into ``params:`` entries whose recorded form is
  ``train.lr=0.25``, so a changed value reruns exactly the jobs that use it and Snakemake's
  rerun reason names the key ("before: train.lr=0.25 now: train.lr=0.2").
* :func:`code_params` fingerprints the code a rule's script reaches, definition by definition
  (:mod:`largeprompt.io.fingerprints`): editing it reruns exactly the rules that use it, and Snakemake's
  reason names the file; comments, docstrings and plumbing rerun nothing.
* :func:`stage_params` rebuilds the nested config mapping a stage reads from those entries.
"""
from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

from largeprompt.io.fingerprints import CODE_PREFIX, code_settings
from largeprompt.io.parquet_io import PRODUCERS_ENV, PRODUCERS_FILE

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Setting(tuple):
    """A config value tagged with its dotted key; its repr ``key=value`` is what Snakemake records."""

    def __new__(cls, key: str, value):
        return super().__new__(cls, (key, value))

    def __getnewargs__(self):  # pickling into the script subprocess
        return tuple(self)

    @property
    def key(self) -> str:
        return self[0]

    @property
    def value(self):
        return self[1]

    def __repr__(self) -> str:
        return f"{self[0]}={self[1]!r}"


def _leaves(node, prefix: str):
    if isinstance(node, dict):
        for key in sorted(node):
            yield from _leaves(node[key], f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix, node


def config_value(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def settings(config: dict, *keys: str, exclude: tuple[str, ...] = ()) -> dict[str, Setting]:
    """``params:`` entries for the config ``keys`` (a mapping key expands to all its leaves).

    ``exclude`` drops leaves that cannot change a result (device, checkpoint cadence, threads).
    """
    out = {}
    for key in keys:
        for dotted, value in _leaves(config_value(config, key), key):
            if dotted in exclude:
                continue
            out[dotted.replace(".", "__")] = Setting(dotted, value)
    return out


def stage_params(params: dict) -> dict:
    """Plain params for a stage: :class:`Setting` entries nested back under their dotted keys; code
    fingerprints (keys ``code:<module>``) under ``code``."""
    out: dict = {}
    for name, value in params.items():
        if isinstance(value, Setting) and value.key.startswith(CODE_PREFIX):
            out.setdefault("code", {})[value.key[len(CODE_PREFIX):]] = value.value
        elif isinstance(value, Setting):
            node = out
            *parents, last = value.key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value.value
        else:
            out[name] = value
    return out


def check_run_name(name: str) -> str:
    """A run name becomes a folder under results/ and figures/: no '/', no '..', nothing hidden."""
    if not isinstance(name, str) or not RUN_NAME.match(name) or ".." in name:
        raise ValueError(
            f"config key 'run' = {name!r}: allowed: 1 to 64 letters, digits, '_', '-' or '.', starting with a "
            "letter or digit, without '/' or '..' (it names the folders results/<run>/ and figures/<run>/)"
        )
    return name


def checkpoint_path(output: str | os.PathLike) -> Path:
    """Where a training job checkpoints: results/<run>/checkpoints/<the output's path below the run>.pt, outside the
    declared outputs so that it survives a killed (incomplete) job; a run-time path, never a param."""
    out = Path(output)
    parts = out.parts
    if "results" in parts and len(parts) > parts.index("results") + 2:
        i = parts.index("results") + 2  # results/<run>/...
        return Path(*parts[:i], "checkpoints", *parts[i:]).with_suffix(".pt")
    return out.with_suffix(".pt")


def code_params(script: str | os.PathLike) -> dict[str, Setting]:
    """``params:`` entries ``code:<file>=<hash>`` for the code a rule's script reaches (:mod:`largeprompt.io.fingerprints`)."""
    return code_settings(script, Setting)


# the keys of section ``train`` that are the summary's status rule (docs/experiments.md#run-status): a training job's log
# names each run by them (Runtime.status_rule)
STATUS_RULE_KEYS = ("trapped_loss_ratio", "trapped_readout_fraction", "unconverged_change", "convergence_window")


@dataclass(frozen=True)
class Runtime:
    """Job settings that cannot change a result: recorded in provenance, never in params."""

    device: str = "auto"
    threads: int = 1
    checkpoint_every: int = 0
    status_rule: dict | None = None  # train.trapped_*: how a training job's log names each run (the summary decides)


def settings_from(cls, mapping: dict, where: str):
    """Build the frozen dataclass ``cls`` from the params mapping ``mapping`` (the config section ``where``).

    Every field must be present: a stage never falls back on a silent default.
    """
    names = [f.name for f in fields(cls)]
    missing = [n for n in names if n not in mapping]
    if missing:
        keys = ", ".join(f"{where}.{n}" if where else n for n in missing)
        raise KeyError(f"{cls.__name__} needs params {keys}; pass them from the rule with cfg(...)")
    return cls(**{n: mapping[n] for n in names})


DEFAULT_RUNTIME = Runtime()  # a stage called by hand runs with device auto, one thread, no checkpoints



def producer_patterns(rule_outputs) -> str:
    """JSON [[regex, rule], …] from (rule, [output pattern, …]): a regex over the path below results/<run>/ per
    output, its wildcards matching any file name part (:func:`largeprompt.io.parquet_io.producing_rule`)."""
    patterns = []
    for rule, outputs in rule_outputs:
        for pattern in outputs:
            match = re.search(r"(?:^|/)results/[^/]+/(.+)$", pattern)
            if match:
                parts = re.split(r"\{[^}]+\}", match[1])
                patterns.append(["^" + "[^/]+".join(re.escape(p) for p in parts) + "$", rule])
    return json.dumps(patterns)


def share_producers(rule_outputs, workdir: Path = Path(".")) -> None:
    """Which rule makes which result file (:func:`producer_patterns`) for the jobs, through their environment, and
    for ``largeprompt inspect``, in ``.snakemake/largeprompt_producers.json`` of the working directory (written
    atomically; a read-only checkout keeps the environment only)."""
    patterns = producer_patterns(rule_outputs)
    os.environ[PRODUCERS_ENV] = patterns
    saved = workdir / PRODUCERS_FILE
    try:
        saved.parent.mkdir(parents=True, exist_ok=True)
        tmp = saved.with_name(f"{saved.name}.{os.getpid()}.tmp")
        tmp.write_text(patterns)
        os.replace(tmp, saved)
    except OSError:
        pass


def report_hint(run: str, figures, root: Path = Path(".")) -> str | None:
    """For ``snakemake --report``: None when figures/<run>/ holds every figure, else a line naming the missing ones,
    the command that builds them and the runs whose figures exist (their config goes with --configfile)."""
    missing = [name for name in figures if not (root / "figures" / run / f"{name}.png").is_file()]
    if not missing:
        return None
    others = sorted(p.name for p in (root / "figures").glob("*") if p.is_dir() and p.name != run and any(p.glob("*.png")))
    hint = (f"note: the report shows run '{run}' (config key `run`), and figures/{run}/ lacks {len(missing)} of its "
            f"{len(figures)} figures ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): build them first with "
            f"`snakemake --cores N` and the same --configfile")
    if others:
        hint += (f"; for another run, add its config file: `snakemake --report report.html --configfile config/<run>.yaml` "
                 f"(figures exist for: {', '.join(others)})")
    return hint


def output_cache_dir(basedir: str | os.PathLike) -> Path:
    """Snakemake's between-workflow cache (docs/architecture.md#sharing-results): ``$SNAKEMAKE_OUTPUT_CACHE``, set to
    ``<basedir>/.snakemake-cache`` when unset, created if missing."""
    path = Path(os.environ.setdefault("SNAKEMAKE_OUTPUT_CACHE", os.path.join(basedir, ".snakemake-cache")))
    path.mkdir(parents=True, exist_ok=True)
    return path


def claim_table_names(claims_source: str | os.PathLike) -> list[str]:
    """The ``table`` of every ``Claim(...)`` written in ``claims_source`` (largeprompt/ledger/claims.py), read from its
    syntax tree: the ledger's inputs without importing the ledger (torch and scipy: about 3 s of every Snakemake call)."""
    field_index = 9  # Claim(claim_id, label, kind, claim, quantity, predicted, rule, why, figure, table, measure)
    tables = set()
    for node in ast.walk(ast.parse(Path(claims_source).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Claim":
            value = next((k.value for k in node.keywords if k.arg == "table"), None)
            value = value if value is not None else (node.args[field_index] if len(node.args) > field_index else None)
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                raise ValueError(f"{claims_source}:{node.lineno}: a Claim's table must be a string literal")
            tables.add(value.value)
    return sorted(tables)
