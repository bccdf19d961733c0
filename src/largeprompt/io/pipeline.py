"""What the Snakemake rules need from the library: config settings as params, run-scoped paths,
the library sources behind each script, and the run-time keys that never change a result.

* :func:`settings` turns config keys into ``params:`` entries whose recorded form is
  ``train.lr=0.25``, so a changed value reruns exactly the jobs that use it and Snakemake's
  rerun reason names the key ("before: train.lr=0.25 now: train.lr=0.2").
* :func:`code_settings` fingerprints the ``src/largeprompt`` modules a workflow script imports,
  directly or through other modules (:func:`library_sources`), as ``params:`` entries: editing the
  code of a module reruns exactly the stages that use it, and Snakemake's reason names the module;
  editing a comment or a docstring reruns nothing (the fingerprint is of the syntax tree without them).
* :func:`stage_params` rebuilds the nested config mapping a stage reads from those entries.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

PACKAGE = "largeprompt"
PACKAGE_DIR = Path(__file__).resolve().parent
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


@functools.cache
def _imports(path: Path) -> set[str]:
    """Absolute names of the largeprompt modules that ``path`` imports anywhere in its body."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inside = path.parent == PACKAGE_DIR or PACKAGE_DIR in path.parents
    package = list(path.relative_to(PACKAGE_DIR.parent).parts[:-1]) if inside else []  # e.g. [largeprompt, stages]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != PACKAGE:
                continue
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)  # `from . import models`
    return names


def _module_file(name: str) -> Path | None:
    parts = name.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def library_sources(script: str | os.PathLike, relative_to: str | os.PathLike | None = None) -> list[str]:
    """The ``src/largeprompt`` files ``script`` depends on through imports (transitively), sorted.

    Package ``__init__`` files are left out (they hold no stage code). Paths are relative to
    ``relative_to`` (default: the working directory), as Snakemake inputs are.
    """
    seen: set[Path] = set()
    todo = [Path(script).resolve()]
    while todo:
        path = todo.pop()
        for name in _imports(path):
            found = _module_file(name)
            if found is None or found in seen or found.name == "__init__.py":
                continue
            seen.add(found)
            todo.append(found)
    root = Path(relative_to or os.getcwd()).resolve()
    return sorted(os.path.relpath(p, root) for p in seen)


CODE_PREFIX = "code:"


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return tree


@functools.cache
def code_fingerprint(path: str | os.PathLike) -> str:
    """A hash of a module's syntax tree without docstrings (comments never reach it): 12 hex digits."""
    tree = _strip_docstrings(ast.parse(Path(path).read_text(), filename=str(path)))
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()[:12]


def code_settings(script: str | os.PathLike) -> dict[str, Setting]:
    """``params:`` entries ``code:<module>=<fingerprint>`` for the script and every library module it imports."""
    out = {}
    for path in [Path(script).resolve()] + [Path("/", p) for p in library_sources(script, relative_to="/")]:
        name = path.relative_to(PACKAGE_DIR).as_posix() if PACKAGE_DIR in path.parents else f"workflow/scripts/{path.name}"
        name = name if name.startswith("workflow/") else f"largeprompt/{name}"
        out["code__" + re.sub(r"\W", "_", name)] = Setting(CODE_PREFIX + name, code_fingerprint(path))
    return out


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
