"""Faults and outcomes of the fault-injection campaign: a fault, one trial, one fault's tally, the Markdown table and its place in
docs/reliability.md (between the marker comments, rewritten by ``campaign.py --write-docs``)."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

START, END = "<!-- campaign table start -->", "<!-- campaign table end -->"


@dataclass
class Trial:
    """One injection: whether the pipeline survived it, the data it lost, what the user was told."""

    survived: bool
    lost: int = 0
    message: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Fault:
    """One kind of fault: ``trial(context, rng, index)`` injects it once and returns the Trial, or a str saying why
    the fault is skipped here."""

    key: str
    title: str
    cap: int | None  # trials: min(K, cap); None: K
    trial: Callable
    group: str = "local"


@dataclass
class FaultResult:
    """The trials of one fault (one row of the table)."""

    key: str
    title: str
    trials: list[Trial] = field(default_factory=list)
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)  # fault-level notes (counts over trials)
    seconds: float = 0.0

    @property
    def survived(self) -> int:
        return sum(t.survived for t in self.trials)

    @property
    def lost(self) -> int:
        return sum(t.lost for t in self.trials)

    @property
    def ok(self) -> bool:
        return self.skipped is None and bool(self.trials) and self.survived == len(self.trials) and self.lost == 0

    def message(self) -> str:
        """The most frequent message, with the number of trials that showed something else."""
        counts = Counter(t.message for t in self.trials if t.message)
        if not counts:
            return ""
        text, n = counts.most_common(1)[0]
        others = sum(counts.values()) - n
        return text + (f" (other wording in {others} trials)" if others else "")

    def line(self) -> str:
        """One line for the console."""
        if self.skipped:
            return f"{self.key}: skipped ({self.skipped})"
        head = f"{self.key}: {self.survived}/{len(self.trials)} survived, {self.lost} files lost, {self.seconds:.0f} s"
        return head + "".join(f"; {n}" for n in self.notes)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """``text`` as one Markdown code span: fenced by more backticks than it holds in a row (CommonMark)."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if fence != "`" else ""
    return f"{fence}{pad}{_cell(text)}{pad}{fence}"


def table(results: list[FaultResult], header: str) -> str:
    """The Markdown table of the campaign, preceded by ``header`` (seed, trial counts, date)."""
    rows = [header, "", "| fault | trials | survived | data lost (must be 0) | message a user sees | notes |", "|---|---|---|---|---|---|"]
    for r in results:
        if r.skipped:
            rows.append(f"| {_cell(r.title)} | 0 | skipped | — | — | {_cell(r.skipped)} |")
            continue
        problems = Counter(p for t in r.trials for p in t.problems)
        notes = list(r.notes) + [f"{n}× {p}" for p, n in problems.most_common()]
        message = r.message()
        rows.append(f"| {_cell(r.title)} | {len(r.trials)} | {r.survived} | {r.lost} | "
                    f"{_code(message) if message else '(none)'} | {_cell('; '.join(notes))} |")
    return "\n".join(rows)


def write_docs(doc: Path, text: str) -> None:
    """Replace what lies between the marker comments of ``doc`` with ``text``."""
    page = doc.read_text()
    head, start, rest = page.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"{doc}: the markers {START} and {END} are missing")
    doc.write_text(f"{head}{START}\n{text}\n{END}{tail}")
