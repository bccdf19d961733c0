"""Two runs side by side (docs/experiments.md#claims): the config values that differ (from the provenance of their
tables), every claim with both intervals and whether it moved, and the tables only one run has."""
from __future__ import annotations

import math

import pandas as pd

from largeprompt.ledger.claims import COLUMNS


def flat(mapping: dict, prefix: str = "") -> dict:
    """Nested config values as dotted keys (``{"icl": {"dim": 5}}`` → ``{"icl.dim": 5}``)."""
    out = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flat(value, name + ".")
        else:
            out[name] = value
    return out


def config_values(provenances: list[dict]) -> dict:
    """Every config value some table of a run records in its provenance (``params``, code fingerprints left out)."""
    out = {}
    for record in provenances:
        params = {k: v for k, v in (record.get("params") or {}).items() if k != "code"}
        out |= flat(params)
    return out


def differing_values(a: dict, b: dict) -> pd.DataFrame:
    """key, value in A, value in B for every key whose values differ (a key one run lacks shows as None)."""
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return pd.DataFrame({"key": keys, "a": [a.get(k) for k in keys], "b": [b.get(k) for k in keys]})


def _moved(ra, rb) -> bool:
    """Whether a claim moved by more than its intervals: disjoint 95% intervals, or (no interval) a different verdict
    or a relative change of its value above 1%."""
    if ra["verdict"] != rb["verdict"]:
        return True
    bounds = [ra["ci_low"], ra["ci_high"], rb["ci_low"], rb["ci_high"]]
    if all(math.isfinite(x) for x in bounds):
        return ra["ci_high"] < rb["ci_low"] or rb["ci_high"] < ra["ci_low"]
    va, vb = ra["value"], rb["value"]
    if not (math.isfinite(va) and math.isfinite(vb)):
        return math.isfinite(va) != math.isfinite(vb)
    return abs(va - vb) > 0.01 * max(abs(va), abs(vb), 1e-12)


def side_by_side(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """One row per claim id of either ledger: value, interval and verdict in A and in B, and ``moved``."""
    keep = ["claim_id", "value", "ci_low", "ci_high", "verdict"]
    empty = {c: float("nan") for c in COLUMNS} | {"verdict": "absent"}
    ids = list(dict.fromkeys([*a["claim_id"], *b["claim_id"]]))
    ia, ib = a.set_index("claim_id"), b.set_index("claim_id")
    rows = []
    for cid in ids:
        ra = ia.loc[cid].to_dict() if cid in ia.index else dict(empty)
        rb = ib.loc[cid].to_dict() if cid in ib.index else dict(empty)
        rows.append({"claim_id": cid, **{f"{k}_a": ra[k] for k in keep[1:]}, **{f"{k}_b": rb[k] for k in keep[1:]},
                     "moved": _moved(ra, rb)})
    return pd.DataFrame(rows)


def only_in_one(a: set[str], b: set[str]) -> pd.DataFrame:
    """The tables (paths under results/<run>/) that exist in only one run."""
    names = sorted(a ^ b)
    return pd.DataFrame({"table": names, "only_in": ["a" if n in a else "b" for n in names]})
