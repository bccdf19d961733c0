"""The campaign's throwaway copy of the repository: Snakemake runs in it, the reference hashes of the smoke run's
Parquet files, and the checks that no result is lost or looks complete while it is not.

The copy is made with ``helpers.copy_repo`` and committed as one git commit (provenance records it); Snakemake runs
from this interpreter with the copy's ``src`` first on PYTHONPATH and a private XDG_CACHE_HOME (the attention
kernel is tuned once there and reused by every run, so every run writes the same bits).
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers import SMOKE, copy_repo, snakemake_cmd

RUN = "smoke"
PLAIN = ("--cores", "2", "--configfile", SMOKE)  # the documented plain command of the smoke run


@dataclass
class SnakemakeRun:
    """One Snakemake process, in its own process group, its output going to ``log``."""

    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 900) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
            raise

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Workspace:
    """A committed copy of the repository under ``base/repo`` with its scratch files (cache, logs) beside it."""

    def __init__(self, base: Path):
        self.base = Path(base)
        self.root = self.base / "repo"
        self.logs = self.base / "snakemake-logs"
        self.xdg = self.base / "xdg-cache"
        self.reference: dict[str, str] = {}
        self._hash_cache: dict[tuple, str] = {}
        self._count = 0
        self.started: list[SnakemakeRun] = []

    @classmethod
    def create(cls, base: Path) -> Workspace:
        ws = cls(base)
        for folder in (ws.root, ws.logs, ws.xdg):
            folder.mkdir(parents=True, exist_ok=True)
        copy_repo(ws.root)
        ws.commit()
        return ws

    def clone(self, base: Path) -> Workspace:
        """A second workspace under ``base``: this one's whole tree (results, git, Snakemake's records, file times),
        the same kernel cache and the same reference."""
        other = Workspace(base)
        other.xdg, other.reference = self.xdg, dict(self.reference)
        other.logs.mkdir(parents=True, exist_ok=True)
        copy_repo(other.root, source=self.root)
        return other

    def commit(self) -> None:
        """One commit holding the copy as it is (provenance records its hash)."""
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=campaign", "-c", "user.email=campaign@localhost", "commit", "-qm", "campaign"]):
            subprocess.run(cmd, cwd=self.root, check=True, capture_output=True)

    def env(self, extra: dict | None = None) -> dict:
        env = dict(os.environ, XDG_CACHE_HOME=str(self.xdg), **(extra or {}))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.root / "src"), os.environ.get("PYTHONPATH")]))
        return env

    def start(self, *args: str, tag: str, env: dict | None = None, cmd: list[str] | None = None) -> SnakemakeRun:
        """Start ``snakemake ARGS`` (or ``cmd``) in the copy, in a new process group."""
        self._count += 1
        log = self.logs / f"{self._count:04d}-{tag}.log"
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd or snakemake_cmd(*args), cwd=self.root, stdout=fh, stderr=subprocess.STDOUT,
                                    env=self.env(env), start_new_session=True)
        self.started.append(SnakemakeRun(proc, log))
        return self.started[-1]

    def stop_all(self) -> None:
        """SIGKILL the process group of every run still going (a campaign that is itself interrupted)."""
        for run in self.started:
            try:
                os.killpg(run.pid, 9)
            except ProcessLookupError:
                continue
            run.proc.wait()

    def run(self, *args: str, tag: str, timeout: float = 1200, env: dict | None = None) -> tuple[int, str]:
        """Run ``snakemake ARGS`` to the end: (exit status, output)."""
        run = self.start(*args, tag=tag, env=env)
        return run.wait(timeout), run.output()

    # --- results ------------------------------------------------------------------------------------------
    def parquet_files(self, run: str = RUN) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in (self.root / "results" / run).rglob("*.parquet"))

    def sha256(self, rel: str) -> str | None:
        """The file's sha256 (cached by inode, size and mtime), None if it vanished meanwhile."""
        path = self.root / rel
        try:
            st = path.stat()
            key = (rel, st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in self._hash_cache:
                self._hash_cache[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        except FileNotFoundError:
            return None
        return self._hash_cache[key]

    def record_reference(self) -> None:
        """The hashes of every Parquet file of the run, as it stands."""
        self.reference = {rel: self.sha256(rel) for rel in self.parquet_files()}

    def audit(self) -> list[str]:
        """Parquet files of the run that exist now and are not bit-identical to the reference (or not in it)."""
        bad = []
        for rel in self.parquet_files():
            digest = self.sha256(rel)
            if digest is not None and digest != self.reference.get(rel):
                bad.append(rel)
        return bad

    def lost(self) -> list[str]:
        """Reference files now missing or different: the data lost."""
        return [rel for rel, digest in self.reference.items() if self.sha256(rel) != digest]

    def stale_temps(self) -> list[str]:
        """Temporary files of interrupted writes left under results/ (hidden ``.name.XXXX.tmp``, ``*.pt.tmp``)."""
        return sorted(str(p.relative_to(self.root)) for p in (self.root / "results").rglob("*.tmp"))

    def clear_stale_temps(self) -> int:
        temps = self.stale_temps()
        for rel in temps:
            (self.root / rel).unlink(missing_ok=True)
        return len(temps)

    def watch(self, run: SnakemakeRun, timeout: float = 900) -> set[str]:
        """Audit the results every 50 ms until ``run`` exits; every file seen not bit-identical."""
        bad: set[str] = set()
        deadline = time.monotonic() + timeout
        while run.running() and time.monotonic() < deadline:
            bad.update(self.audit())
            time.sleep(0.05)
        run.wait(max(1.0, deadline - time.monotonic()))
        bad.update(self.audit())
        return bad

    def unlock(self) -> int:
        return self.run("--unlock", "--configfile", SMOKE, tag="unlock")[0]


_ABBREVIATIONS = [
    (re.compile(r"Command '[^']*' (died with <Signals\.\w+: \d+>|returned non-zero exit status \d+)"), r"Command '…' \1"),
    (re.compile(r"/\S*/repo/"), ""),
    (re.compile(r"SLURM-job '\d+'"), "SLURM-job 'N'"),
    (re.compile(r"\(jobid \d+\)|jobid: \d+"), ""),
    (re.compile(r"Elapsed time: [\d:.]+"), "Elapsed time: …"),
]


def brief(line: str) -> str:
    """A message line without the copy's path, long commands, job numbers and timings (so that trials compare)."""
    for pattern, repl in _ABBREVIATIONS:
        line = pattern.sub(repl, line)
    return line.strip()


def user_message(output: str, rule: str | None = None) -> str:
    """What a user reads of a failure in Snakemake's output: its 'Error in rule' line, the SLURM or lock message, the
    command's fate and the job's own one-line ``error:``; '' when there is none."""
    keys = [
        "^Error in rule " + (rule or r"\w+") + ":",
        r"^\s*message: (?!None)(.*)",
        r"(Directory cannot be locked\.)",
        r"(Command '.*' (?:died with <Signals\.\w+: \d+>|returned non-zero exit status \d+))",
        r"^(error: .*)",
        r"(Terminating processes on user request.*|Keyboard ?interrupt.*)",
    ]
    parts = []
    for key in keys:
        m = re.search(key, output, flags=re.M)
        if m:
            text = brief(m.group(m.lastindex or 0))
            parts.append(text[:160] + ("…" if len(text) > 160 else ""))
    return " / ".join(parts)
