"""Config validation with errors that name the key and the allowed range (docs/experiments.md#configurations).

The JSON-schema in ``workflow/schemas/config.schema.yaml`` is the single source of truth for
types, ranges and defaults. ``check_config`` runs it and turns every violation into one line
``config key 'a.b.c' = VALUE: PROBLEM (allowed: RANGE)``; cross-key rules that a schema cannot
express (matching lengths, say) follow.
"""
from __future__ import annotations

import copy
import difflib
import functools
import json
import math
import re
import sys
from pathlib import Path

import jsonschema
import yaml

from largeprompt.io.config_rules import cross_key_errors


class ConfigError(ValueError):
    """The configuration is invalid; the message names each offending key."""


def load_schema(path: str | Path) -> dict:
    return copy.deepcopy(_parsed_schema(str(path)))


@functools.lru_cache(maxsize=8)
def _parsed_schema(path: str) -> dict:
    with open(path) as fh:
        return yaml.safe_load(fh)



def _key(path) -> str:
    parts = []
    for p in path:
        if isinstance(p, int):
            parts[-1] = f"{parts[-1]}[{p}]" if parts else f"[{p}]"
        else:
            parts.append(str(p))
    return ".".join(parts) if parts else "<top level>"


def allowed_range(node: dict) -> str:
    """A short human description of what a schema node accepts."""
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v) for v in node["enum"])
    kind = node.get("type", "value")
    if kind == "array":
        item = node.get("items", {})
        bits = [f"a list of {allowed_range(item)}" if item else "a list"]
        if "minItems" in node or "maxItems" in node:
            bits.append(f"with {node.get('minItems', 0)} to {node.get('maxItems', '∞')} entries")
        if node.get("uniqueItems"):
            bits.append("no repeats")
        return " ".join(bits)
    if kind == "object":
        props = node.get("properties", {})
        return "a mapping with keys " + ", ".join(props) if props else "a mapping"
    lo = "[" + str(node["minimum"]) if "minimum" in node else ("(" + str(node["exclusiveMinimum"]) if "exclusiveMinimum" in node else "(-∞")
    hi = str(node["maximum"]) + "]" if "maximum" in node else (str(node["exclusiveMaximum"]) + ")" if "exclusiveMaximum" in node else "∞)")
    if lo == "(-∞" and hi == "∞)":
        return f"{kind}"
    return f"{kind} in {lo}, {hi}"


def nan_errors(node, schema: dict, path=()) -> list[str]:
    """One line per numeric value that is NaN, anywhere in the config: NaN compares false with every bound, so the
    schema's minimum and maximum never reject it (docs/reliability.md#config-fuzzing)."""
    if isinstance(node, float) and math.isnan(node):
        return [f"config key '{_key(path)}' = NaN: not a number (allowed: {allowed_range(schema)})"]
    lines = []
    if isinstance(node, dict):
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        for key, value in node.items():
            lines += nan_errors(value, props.get(key, {}), (*path, key))
    elif isinstance(node, list):
        items = schema.get("items", {}) if isinstance(schema, dict) else {}
        for i, value in enumerate(node):
            lines += nan_errors(value, items if isinstance(items, dict) else {}, (*path, i))
    return lines


def schema_errors(config: dict, schema: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    lines = nan_errors(config, schema)
    if lines:  # the schema's own messages about a NaN ("nan is not of type integer") would repeat these lines
        return lines
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        key = _key(err.absolute_path)
        if err.validator == "required":
            missing = err.message.split("'")[1] if "'" in err.message else err.message
            sub = err.schema.get("properties", {}).get(missing, {})
            full = f"{key}.{missing}" if err.absolute_path else missing
            lines.append(f"config key '{full}' is missing (allowed: {allowed_range(sub)})")
        elif err.validator == "additionalProperties":
            lines.append(_unknown_key_message(err, key))
        elif err.validator in ("pattern", "not") and err.absolute_path and err.absolute_path[-1] == "run":
            lines.append(f"config key 'run' = {json.dumps(err.instance)}: the run name becomes a folder of results/, figures/ "
                         "and logs/ (allowed: 1 to 64 letters, digits, '_', '-', '.', starting with a letter or digit; "
                         "no '/' and no '..')")
        else:
            lines.append(
                f"config key '{key}' = {json.dumps(err.instance)}: {err.message} (allowed: {allowed_range(err.schema)})"
            )
    return list(dict.fromkeys(lines))  # one line per problem: 'pattern' and 'not' can both reject a run name


def _unknown_key_message(err, key: str) -> str:
    """An unknown key, with the closest allowed key when there is one ("did you mean")."""
    allowed = list(err.schema.get("properties", {}))
    extra = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
    where = f"under '{key}'" if key != "<top level>" else "at the top level"
    parts = []
    for name in extra:
        close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
        parts.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return f"config key {where}: unknown key {', '.join(parts)} (allowed keys: {', '.join(allowed)})"


NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def coerce_numbers(config, schema: dict):
    """Read strings such as "1e-3" as numbers where the schema expects one, in place.

    YAML 1.1 (PyYAML, Snakemake) reads ``1e-3`` without a decimal point as a string; scientific notation
    is how people write learning rates. Integers stay integers where the schema asks for one.
    """
    kind = schema.get("type")
    if isinstance(config, dict):
        props = schema.get("properties", {})
        for k, v in config.items():
            if k in props:
                config[k] = coerce_numbers(v, props[k])
        return config
    if isinstance(config, list) and isinstance(schema.get("items"), dict):
        return [coerce_numbers(v, schema["items"]) for v in config]
    if isinstance(config, str) and kind in ("number", "integer") and NUMBER.match(config.strip()):
        value = float(config)
        return int(value) if kind == "integer" and value.is_integer() else value
    return config


DEPRECATION = ("config key 'bounds' is deprecated and will be removed in the next release: its random-query keys are "
               "now under 'concentration' and 'bounds.fixed_query' is now 'fixed_query_bound'; it is read that way for now")


def _merge(base: dict, overlay: dict) -> None:
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


RENAMED_KEYS = {  # (section, old key) → new key: renamed into the paper's language
    ("concentration", "measures"): "token_measures",
    ("affine_limit", "measures"): "token_measures",
}


def renamed_message(section: str, old: str, new: str) -> str:
    return (f"config key '{section}.{old}' is deprecated and will be removed in the next release: it is now "
            f"'{section}.{new}'; it is read that way for now")


def _migrate_bounds(config: dict) -> list[str]:
    """``bounds`` (the concentration sweep and the fixed-query experiment) became ``concentration`` and
    ``fixed_query_bound``; its shared ``chunk_size`` and ``ci_level`` apply to both."""
    if "bounds" not in config:
        return []
    old = dict(config.pop("bounds") or {})
    fixed = dict(old.pop("fixed_query", None) or {})
    fixed.update({k: old[k] for k in ("chunk_size", "ci_level") if k in old and k not in fixed})
    _merge(config.setdefault("concentration", {}), old)
    _merge(config.setdefault("fixed_query_bound", {}), fixed)
    return [DEPRECATION]


RENAMED_SECTIONS = {  # old path → new path: R4 has one name, trajectory_transfer (docs/architecture.md#naming)
    ("transfer",): ("trajectory_transfer",),
    ("beyond_gaussian", "transfer"): ("beyond_gaussian", "trajectory_transfer"),
}


def _migrate_sections(config: dict) -> list[str]:
    """The sections of RENAMED_SECTIONS, merged into their new name (the old section's keys win, as for
    RENAMED_KEYS)."""
    messages = []
    for old, new in RENAMED_SECTIONS.items():
        parent = config
        for key in old[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or old[-1] not in parent:
            continue
        moved = parent.pop(old[-1]) or {}
        if isinstance(moved, dict):
            _merge(parent.setdefault(new[-1], {}), moved)
        else:
            parent[new[-1]] = moved  # not a mapping: left for the schema to name under its new key
        messages.append(f"config key '{'.'.join(old)}' is deprecated and will be removed in the next release: it is "
                        f"now '{'.'.join(new)}'; it is read that way for now")
    return messages


def _migrate_renamed(config: dict) -> list[str]:
    """The keys of RENAMED_KEYS, moved to their new name (the old name wins: a config file that still uses it is
    overlaid on defaults that already use the new one)."""
    messages = []
    for (section, old), new in RENAMED_KEYS.items():
        node = config.get(section)
        if isinstance(node, dict) and old in node:
            node[new] = node.pop(old)
            messages.append(renamed_message(section, old, new))
    return messages


def migrate_deprecated(config: dict, warn=None) -> bool:
    """Move the keys this release renamed to their new place, in place, with one deprecation message per move naming
    the new keys (``warn``, default: printed to stderr); returns whether anything moved."""
    messages = _migrate_bounds(config) + _migrate_sections(config) + _migrate_renamed(config)
    warn = warn or (lambda line: print(f"WARNING: {line}", file=sys.stderr))
    for text in messages:
        warn(text)
    return bool(messages)


def check_config(config: dict, schema_path: str | Path) -> None:
    """Raise ConfigError listing every invalid key, or return None. Numeric strings are read as numbers first."""
    schema = _parsed_schema(str(schema_path))  # read-only here: parsed once per process
    coerce_numbers(config, schema)
    lines = schema_errors(config, schema)
    if not lines:
        lines = cross_key_errors(config)
    if lines:
        raise ConfigError(
            "invalid configuration:\n  - " + "\n  - ".join(lines)
            + "\nFix these keys in config/config.yaml or in the file passed with --configfile."
        )


def canonical(value):
    """A copy with mapping keys sorted at every level, so params compare equal however the YAML is ordered.

    Snakemake detects changed params by their string form; reordering keys in a config file must
    not rerun anything.
    """
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def read_config_file(path: str | Path) -> dict:
    """The mapping in a config file, or ConfigError in one line naming the file (and the YAML line where there is one).

    Snakemake reads ``--configfile`` itself before the workflow starts, with generic messages;
    ``largeprompt check-config`` gives these instead."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found (the path is relative to the directory you run snakemake in)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path}: cannot be read ({err})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file {path}{where}: not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        what = "is empty (or only comments)" if data is None else f"holds a {type(data).__name__}, not keys"
        raise ConfigError(f"config file {path} {what}: a config file is a YAML mapping of keys, e.g. `run: my-run`")
    return data


def check_config_files(paths, base: str | Path, schema_path: str | Path) -> None:
    """Read ``base`` and the overlays ``paths`` as ``snakemake --configfile`` merges them, and check the result;
    raise ConfigError (one line per problem) or return None."""
    config = read_config_file(base)
    for path in paths:
        _merge(config, read_config_file(path))
    migrate_deprecated(config)
    check_config(config, schema_path)
