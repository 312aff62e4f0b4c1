"""The README is a front page and docs/ holds the rest, one page per concern; the settings table is in one place."""

import re
from pathlib import Path

from api.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted(path for path in (ROOT / "docs").glob("*.md") if not path.name.startswith("_"))
CONFIGURATION = ROOT / "docs" / "configuration.md"


def _table_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]


def test_the_readme_stays_a_front_page_of_at_most_15_kb() -> None:
    size = len(README.read_bytes())
    assert 5_000 < size <= 15_000, size  # the lower bound: the front page still has its content


def test_every_docs_page_is_in_the_readme_index_and_opens_with_what_it_is_for() -> None:
    index = README.read_text().split("## Documentation", 1)[1]
    assert len(PAGES) >= 10
    for page in PAGES:
        assert f"](docs/{page.name})" in index, f"{page.name} is missing from the README's documentation index"
        title, blank, first, *_ = page.read_text().splitlines()
        assert title.startswith("# "), page.name
        assert blank == "", page.name
        assert first, f"{page.name} opens without a sentence"
        assert not first.startswith(("#", "|", "-", "*", "```")), f"{page.name} opens without a sentence"


def test_every_setting_has_a_row_in_the_one_settings_table() -> None:
    rows = _table_rows(CONFIGURATION.read_text())
    documented = {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", " ".join(row))}
    names = {name.upper() for name in Settings.model_fields}
    assert len(names) > 40
    assert names - documented == set(), "settings missing from docs/configuration.md"


def test_no_other_document_has_a_settings_table() -> None:
    names = {name.upper() for name in Settings.model_fields}
    assert any(row[0] == "`DATABASE_URL`" for row in _table_rows(CONFIGURATION.read_text()))  # the check sees it
    for document in [README, *PAGES]:
        if document == CONFIGURATION:
            continue
        for row in _table_rows(document.read_text()):
            # A settings row names settings and nothing else in its first column (other tables mention them).
            if re.fullmatch(r"`[A-Z][A-Z0-9_*]*`(, `[A-Z][A-Z0-9_*]*`)*", row[0]):
                named = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", row[0]))
                assert not named & names, f"{document.name} has a settings row ({row[0]}): put it in configuration.md"
