"""Build and load the native kernels (docs/performance.md#native-readout): C sources that ship with the package,
compiled once per machine.

A kernel's text is ``vector_math.h`` (the vector helpers every kernel shares) followed by its own ``.c`` file,
compiled by the system's C compiler (``$CC``, else ``cc``) with ``-O3 -march=native`` into
``~/.cache/largeprompt/native/`` under a name that hashes the text, the flags, the compiler's version and the
machine, under the kernel cache's lock; a killed build leaves no library. Where there is no compiler, the build
fails, or ``LARGEPROMPT_NATIVE=0``, :func:`load` returns None (with one warning) and the callers use torch.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import warnings
from importlib import resources
from pathlib import Path

from largeprompt.kernel.kernel_cache import cache_file, cpu_model, locked

ENV_NATIVE = "LARGEPROMPT_NATIVE"
VECTOR_SOURCE = "vector_math.h"  # fingerprinted with this constant (largeprompt.io.fingerprints)
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fPIC", "-shared", "-std=gnu11")


def source(name: str, package: str = __package__) -> str:
    """The translation unit of kernel ``name`` (a ``.c`` file of ``package``): the shared helpers of this package,
    then its text."""
    helpers = resources.files(__package__).joinpath(VECTOR_SOURCE).read_text()
    return helpers + "\n" + resources.files(package).joinpath(name).read_text()


def _compiler() -> str:
    return os.environ.get("CC", "cc")


def _build_name(name: str, compiler: str, package: str) -> str:
    """The library's file name: a hash of the source, the flags, the compiler's version and the machine."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    digest = hashlib.sha256("\n".join([source(name, package), " ".join(FLAGS), version, cpu_model()]).encode())
    return f"{Path(name).stem}-{digest.hexdigest()[:16]}.so"


def _compile(name: str, compiler: str, target: Path, package: str) -> None:
    """Compile to a temporary file next to ``target``, then rename (a killed build leaves no library)."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / name
        src.write_text(source(name, package))
        out = Path(tmp) / target.name
        done = subprocess.run([compiler, *FLAGS, "-o", str(out), str(src)], capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")
        os.replace(out, target)


def enabled() -> bool:
    """False where ``LARGEPROMPT_NATIVE=0``."""
    return os.environ.get(ENV_NATIVE, "1").strip() != "0"


def load(name: str, entries: dict[str, list], package: str = __package__) -> ctypes.CDLL | None:
    """The compiled kernel ``name`` of ``package`` (built on first use) with each entry point's argument types set (``entries``:
    {function: ctypes argument types}; every entry returns an int), or None where it cannot be built, with a
    warning; callers cache it."""
    if not enabled():
        return None
    compiler = _compiler()
    try:
        folder = cache_file().parent / "native"
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / _build_name(name, compiler, package)
        with locked(folder / ".lock"):
            if not target.exists():
                _compile(name, compiler, target, package)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        warnings.warn(f"native kernel {name} unavailable ({exc}); torch is used instead. Install a C compiler (e.g. "
                      f"apt-get install gcc) or set CC, or set {ENV_NATIVE}=0 to silence this", stacklevel=3)
        return None
    for function, argtypes in entries.items():
        getattr(lib, function).argtypes, getattr(lib, function).restype = argtypes, ctypes.c_int
    return lib
