"""Every reference in the repository resolves inside the repository.

Code, docs and README cite the op semantics as P1..P24 and sections as ``§N``; those live in
docs/semantics.md and docs/architecture.md. A citation of a section that does not exist, of a
file the repository does not have (the original design notes stayed outside it), or a markdown
link to a missing file or anchor fails here, naming the file and line.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".txt", ".cfg"}
# Files outside the repository that older text cited; their content now lives in docs/.
OUTSIDE = ("DESIGN.md", "primitives.md", "users_and_performance.md", "architecture_anchors.md", "ci_matrices.md",
           "research/")
SECTION_DOCS = ("architecture.md", "semantics.md")


def _tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the reference check runs from a source checkout")
    files = [ROOT / name for name in listed if (ROOT / name).is_file()]
    return [path for path in files if (path.suffix in TEXT_SUFFIXES or path.name in ("Makefile", "run"))
            and "compat-reports" not in path.parts and path.name != Path(__file__).name]


def _lines():
    for path in _tracked_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            yield path, number, line


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _headings(doc: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in doc.read_text().splitlines() if line.startswith("#")]


def test_no_reference_to_files_outside_the_repository():
    bad = [f"{path.relative_to(ROOT)}:{number}: {name}" for path, number, line in _lines() for name in OUTSIDE
           if name in line]
    assert not bad, "cite docs/architecture.md or docs/semantics.md instead:\n" + "\n".join(bad)


def test_p_numbers_have_a_section_in_semantics():
    sections = {match.group(1) for heading in _headings(DOCS / "semantics.md")
                for match in [re.match(r"P(\d+)\.", heading)] if match}
    assert sections == {str(n) for n in range(1, 25)}
    bad = [f"{path.relative_to(ROOT)}:{number}: P{cited}" for path, number, line in _lines()
           for cited in re.findall(r"\bP(\d{1,2})\b", line) if cited not in sections]
    assert not bad, "no such section in docs/semantics.md:\n" + "\n".join(bad)


def test_section_signs_name_their_document_and_resolve():
    sections = {name: {match.group(1) for heading in _headings(DOCS / name)
                       for match in [re.match(r"§([\d.]*\d)\.?\s", heading)] if match} for name in SECTION_DOCS}
    bad = []
    for path, number, line in _lines():
        for match in re.finditer(r"§([\d.]*\d)", line):
            documents = re.findall(r"([\w-]+\.md)", line[:match.start()])
            document = documents[-1] if documents else (path.name if path.parent == DOCS else None)
            if document not in sections:
                bad.append(f"{path.relative_to(ROOT)}:{number}: §{match.group(1)} names no document "
                           f"(write docs/architecture.md §N or docs/semantics.md §N)")
            elif match.group(1) not in sections[document]:
                bad.append(f"{path.relative_to(ROOT)}:{number}: {document} has no §{match.group(1)}")
    assert not bad, "\n".join(bad)


def test_docs_paths_and_markdown_links_resolve():
    bad = []
    for path, number, line in _lines():
        for cited in re.findall(r"\bdocs/[\w.-]+\.md\b", line):
            if not (ROOT / cited).is_file():
                bad.append(f"{path.relative_to(ROOT)}:{number}: {cited} does not exist")
        if path.suffix != ".md":
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                bad.append(f"{path.relative_to(ROOT)}:{number}: link to missing {file_part}")
            elif anchor and linked.suffix == ".md" and anchor not in {_anchor(h) for h in _headings(linked)}:
                bad.append(f"{path.relative_to(ROOT)}:{number}: no heading #{anchor} in {file_part or path.name}")
    assert not bad, "\n".join(bad)


def test_the_catches_work_on_a_dangling_example(tmp_path):
    # The rules above must be able to fail: a made-up line trips each of them.
    assert "DESIGN.md" in OUTSIDE
    assert re.findall(r"\bP(\d{1,2})\b", "see P25") == ["25"]
    assert _anchor("§2. Upstream bugs these semantics prevent") == "2-upstream-bugs-these-semantics-prevent"
