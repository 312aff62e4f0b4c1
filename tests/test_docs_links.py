"""The README and docs point only at files that ship with the repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_in_the_readme_and_docs_names_a_file_inside_the_repository() -> None:
    checked = 0
    for document in DOCUMENTS:
        text = document.read_text()
        links = re.findall(r"\]\(([^)\s]+)\)", text)
        quoted_paths = re.findall(r"`(\.\.?/[^`\s]+)`", text)
        for link in [*links, *quoted_paths]:
            if re.match(r"[a-z]+:|#", link):
                continue
            target = (document.parent / link.split("#")[0]).resolve()
            assert target.is_relative_to(ROOT), f"{document.name}: {link} is outside the repository"
            assert target.exists(), f"{document.name}: {link} does not exist"
            checked += 1
    assert checked >= 5  # the README links docs/*.md; a parser that finds nothing proves nothing
