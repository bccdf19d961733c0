"""Where and in which precision the compute stages run: the config keys ``device`` and ``dtype``."""
from __future__ import annotations

import torch

DTYPES = {"float64": torch.float64, "float32": torch.float32}
DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str = "auto") -> torch.device:
    """The torch device for config value ``device`` (auto = cuda when torch sees one, else cpu)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config key 'device' = \"cuda\" but torch sees no CUDA device; use 'auto' or 'cpu'")
    if name not in DEVICES:
        raise ValueError(f"config key 'device' = {name!r}: allowed {', '.join(DEVICES)}")
    return torch.device(name)


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype for config value ``dtype`` (float64 | float32)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"config key 'dtype' = {name!r}: allowed {', '.join(DTYPES)}") from None
