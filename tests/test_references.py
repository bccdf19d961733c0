"""The repository cites only itself and the paper: no labels of the team's private notes anywhere, and every
anchor of docs/theory.md or docs/experiments.md cited in a shipped file exists."""
import re
import subprocess

from helpers import REPO

# Labels of the team's notes and a path to them (first letters bracketed so that a grep for the labels finds none here).
PRIVATE = re.compile(r"\b[S]PEC\b|\b[T]HEORY\b|\bF[1-9]\b|§[A-Z]|[.][.]/shared")
CITED = re.compile(r"docs/(theory|experiments)\.md#([A-Za-z0-9_-]+)")
ANCHOR = re.compile(r'<a id="([^"]+)"></a>')


def shipped_texts() -> dict[str, str]:
    """Every file git would ship (tracked, or untracked and not ignored) that reads as UTF-8 text."""
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    texts = {}
    for name in filter(None, names):
        path = REPO / name
        if path.is_file():
            try:
                texts[name] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
    return texts


def test_no_labels_of_private_notes():
    hits = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()!r}"
            for name, text in shipped_texts().items() for m in PRIVATE.finditer(text)]
    assert not hits, "cite a docs anchor (docs/theory.md, docs/experiments.md) or the paper's theorem numbers instead:\n" + "\n".join(hits)


def test_every_cited_docs_anchor_exists():
    anchors = {doc: set(ANCHOR.findall((REPO / "docs" / f"{doc}.md").read_text())) for doc in ("theory", "experiments")}
    missing = sorted({f"{name}: docs/{doc}.md#{anchor}" for name, text in shipped_texts().items()
                      for doc, anchor in CITED.findall(text) if anchor not in anchors[doc]})
    assert not missing, "cited anchors missing from the docs:\n" + "\n".join(missing)


MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _headings_as_anchors(text: str) -> set[str]:
    """GitHub's anchors for a file's headings (lower case, punctuation dropped, spaces to hyphens)."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_every_relative_link_of_the_readme_and_docs_resolves():
    """A link from the front door or a docs page to a file or an anchor in the repository reaches it."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in MARKDOWN_LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                text = dest.read_text()
                if anchor not in set(ANCHOR.findall(text)) | _headings_as_anchors(text):
                    broken.append(f"{page.relative_to(REPO)}: {target} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)
