"""Which code each rule's numbers depend on, fingerprinted definition by definition (docs/architecture.md#fingerprints).

A rule runs ``workflow/scripts/<rule>.py``, which calls one stage function. Starting from that script, this
module follows every name the code uses to the top-level definition it names (a function, a class, a
constant) in a ``largeprompt`` module, transitively; the code reached is the code that can change the
rule's numbers. The rule's params then carry one entry per definition name reached, ``code:<name>=<hash>`` (syntax
trees without docstrings, so comments and docstrings never count; imports are not part of any definition), one per
file for its statements that are not definitions (``matplotlib.use(...)``, say: they count wherever any definition of
the module is reached) and one for the script. Editing a function reruns exactly the rules that reach it, and
Snakemake's rerun reason names it; moving a definition to another module unchanged reruns nothing.
:mod:`largeprompt.io` is plumbing (Parquet writing, provenance, logs, progress bars, params): never followed, never
fingerprinted, since it cannot change a number. Code in another
language that a module builds is named by a constant ``*_SOURCE = "<file>"`` next to it; the file's whole text
counts as that constant's definition.

``python -m largeprompt.io.fingerprints`` prints the table of docs/architecture.md#rerun-table: for each
module, the rules its code reaches.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import os
import pickle
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "largeprompt"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
PLUMBING = (f"{PACKAGE}.io", f"{PACKAGE}.icl.engine.run_log")  # code that cannot change a number (the log's lines)
PREAMBLE = "<module>"  # the key of a module's statements that are not definitions
CODE_PREFIX = "code:"
FOREIGN_SUFFIX = "_SOURCE"  # a constant NAME_SOURCE = "<file>" makes that file's text part of its definition
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "largeprompt" / "parsed-modules"


def module_file(name: str) -> Path | None:
    """The file of the ``largeprompt`` module ``name`` (a package's ``__init__.py``), or None."""
    base = PACKAGE_DIR.joinpath(*name.split(".")[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def is_plumbing(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PLUMBING)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return tree


@dataclass
class Module:
    """One parsed module: its top-level definitions (syntax dumps), what each refers to, and its namespace."""

    name: str
    path: Path
    units: dict[str, str] = field(default_factory=dict)  # definition name → syntax dump
    refs: dict[str, set] = field(default_factory=dict)  # definition name → {(module, name)} it uses
    bound: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # imported name → (module, name or None)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _bind_imports(mod: Module, tree: ast.Module) -> None:
    """Names bound by the module's top-level imports: to a module (name None) or to a definition in one."""
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == PACKAGE:
                    mod.bound[a.asname or a.name.split(".")[0]] = (a.name if a.asname else PACKAGE, None)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(mod.name, mod.path.name == "__init__.py", node)
            if source.split(".")[0] != PACKAGE:
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                mod.bound[a.asname or a.name] = (sub, None) if module_file(sub) else (source, a.name)


def _definition_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id] + parts[::-1] if isinstance(node, ast.Name) else None


class _Uses(ast.NodeVisitor):
    """(module, name) pairs a piece of syntax uses: names of its own module, imported definitions, and the
    longest attribute chain below an imported module (``models.flatten`` → (…icl.models, "flatten")); a module
    used whole (passed around, not through an attribute) gives (module, None)."""

    def __init__(self, mod: Module, local: set[str]):
        self.mod, self.local, self.out = mod, local, set()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = _attribute_chain(node)
        if chain and chain[0] in self.mod.bound and self.mod.bound[chain[0]][1] is None:
            target, rest = self.mod.bound[chain[0]][0], chain[1:]
            while rest and module_file(f"{target}.{rest[0]}"):  # down through subpackages to the definition
                target, rest = f"{target}.{rest[0]}", rest[1:]
            self.out.add((target, rest[0] if rest else None))
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.mod.bound:
            self.out.add(self.mod.bound[node.id])
        elif node.id in self.local:
            self.out.add((self.mod.name, node.id))


def _references(mod: Module, node: ast.AST, local: set[str]) -> set[tuple[str, str | None]]:
    uses = _Uses(mod, local)
    uses.visit(node)
    return uses.out


def _foreign_source(path: Path, name: str, node: ast.stmt) -> str:
    """The text of the file that a constant ``*_SOURCE = "<file>"`` names next to its module (e.g. C code that the
    module compiles): it counts as that constant's definition; '' for any other definition."""
    if not (name.endswith(FOREIGN_SUFFIX) and isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)):
        return ""
    foreign = path.parent / node.value.value
    return foreign.read_text() if foreign.is_file() else ""


@functools.cache
def _layout() -> str:
    """Every module file of the package and this module's own text: what a parse may depend on beyond its file."""
    files = sorted(p.relative_to(PACKAGE_DIR).as_posix() for p in PACKAGE_DIR.rglob("*.py"))
    return "\n".join([Path(__file__).read_text(), *files])


@functools.cache
def parse_module(name: str, path: Path | None = None) -> Module:
    """The :class:`Module` of ``name`` (or of a script at ``path``, named ``name``), from the on-disk cache
    (``CACHE_DIR``) when one was parsed from the same text, foreign sources, package layout and parser: parsing
    every module costs each Snakemake call about 2.5 s."""
    path = path or module_file(name)
    text = path.read_text()
    foreign = [(path.parent / f).read_text() if (path.parent / f).is_file() else ""
               for f in re.findall(r"\w+" + FOREIGN_SUFFIX + r"\s*=\s*[\"']([^\"']+)[\"']", text)]
    key = hashlib.sha256("\0".join([name, str(path), _layout(), text, *foreign]).encode()).hexdigest()
    cached = CACHE_DIR / f"{key}.pickle"
    try:
        return pickle.loads(cached.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
        pass
    mod = _parse(name, path, text)
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(pickle.dumps(mod))
        os.replace(partial, cached)  # atomic: a concurrent reader sees the whole entry or none
    except OSError:
        pass
    return mod


def _parse(name: str, path: Path, text: str) -> Module:
    tree = _strip_docstrings(ast.parse(text, filename=str(path)))
    mod = Module(name, path)
    _bind_imports(mod, tree)
    local = {n for node in tree.body for n in _definition_names(node)}
    preamble = []
    for node in tree.body:
        names = _definition_names(node)
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue
        if not names:
            preamble.append(node)
        for n in names:
            mod.units[n] = mod.units.get(n, "") + ast.dump(node, annotate_fields=False) + _foreign_source(path, n, node)
            mod.refs.setdefault(n, set()).update(_references(mod, node, local))
    if preamble:
        mod.units[PREAMBLE] = "".join(ast.dump(n, annotate_fields=False) for n in preamble)
        mod.refs[PREAMBLE] = set().union(*(_references(mod, n, local) for n in preamble))
    return mod


def reached(script: str | os.PathLike) -> dict[str, set[str]]:
    """module → the names of its definitions that the script reaches (plumbing left out), the script itself
    under the module name ``workflow.scripts.<stem>``."""
    script = Path(script).resolve()
    entry = parse_module(f"workflow.scripts.{script.stem}", script)
    seen: dict[str, set[str]] = {entry.name: set(entry.units)}
    todo = [r for refs in entry.refs.values() for r in refs]
    while todo:
        module, name = todo.pop()
        if is_plumbing(module) or module_file(module) is None:
            continue
        mod = parse_module(module)
        if name is not None and name not in mod.units:
            if name in mod.bound:  # a name the module imports from elsewhere (a re-export)
                todo.append(mod.bound[name])
            continue
        wanted = set(mod.units) if name is None else {name} | ({PREAMBLE} & set(mod.units))
        new = wanted - seen.setdefault(module, set())
        seen[module] |= new
        for unit in new:
            todo.extend(mod.refs.get(unit, ()))
    return {m: names for m, names in seen.items() if names}


def fingerprint_entries(units: dict[str, dict[str, str]]) -> dict[str, str]:
    """label → hash of the reached code ``units`` ({file label: {definition name: syntax dump}}): one entry per
    top-level definition *name* (same-named definitions of several files hashed together), one per file for its
    statements that are not definitions (PREAMBLE, and a script's whole text). Keyed by name, not by file, so moving a
    definition to another module without changing it changes no entry (docs/architecture.md#fingerprints)."""
    parts: dict[str, list[str]] = {}
    for label, names in units.items():
        script = label.startswith("workflow/")
        for name, dump in names.items():
            key = label if script or name == PREAMBLE else name
            parts.setdefault(key, []).append(f"{name}:{dump}")
    return {key: hashlib.sha256("".join(sorted(p)).encode()).hexdigest()[:12] for key, p in sorted(parts.items())}


def code_settings(script: str | os.PathLike, setting) -> dict:
    """``params:`` entries ``code:<label>=<hash>`` for the code a rule's script reaches (:func:`fingerprint_entries`:
    ``code:<definition name>``, ``code:<file>`` for a module's other statements and for the script itself);
    ``setting(key, value)`` builds each entry (:class:`largeprompt.io.pipeline.Setting`)."""
    units = {}
    for module, names in sorted(reached(script).items()):
        mod = parse_module(module, Path(script).resolve() if module.startswith("workflow.") else None)
        label = f"workflow/scripts/{Path(script).name}" if module.startswith("workflow.") else \
            mod.path.relative_to(PACKAGE_DIR.parent).as_posix()
        units[label] = {n: mod.units[n] for n in names}
    return {"code__" + re.sub(r"\W", "_", label): setting(CODE_PREFIX + label, digest)
            for label, digest in fingerprint_entries(units).items()}


def rerun_table(scripts_dir: str | os.PathLike) -> dict[str, list[str]]:
    """library file → the rules (= script stems) whose numbers its code can change; plumbing files map to []."""
    table: dict[str, set[str]] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        table[path.relative_to(PACKAGE_DIR.parent).as_posix()] = set()
    for script in sorted(Path(scripts_dir).glob("*.py")):
        for module in reached(script):
            if not module.startswith("workflow."):
                table[module_file(module).relative_to(PACKAGE_DIR.parent).as_posix()].add(script.stem)
    return {k: sorted(v) for k, v in table.items()}


def markdown_table(scripts_dir: str | os.PathLike) -> str:
    """The rerun table as Markdown rows: | file | rules it reruns |."""
    rows = ["| module | rules whose numbers it can change (rerun when its code changes) |", "|---|---|"]
    for path, rules in rerun_table(scripts_dir).items():
        rows.append(f"| `{path}` | {', '.join(f'`{r}`' for r in rules) if rules else 'none'} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table(sys.argv[1] if len(sys.argv) > 1 else "workflow/scripts"))
