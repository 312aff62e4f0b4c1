"""Read the commands a person would copy out of the README and docs, so tests run exactly those."""

import re
import textwrap


def fenced_block(text: str, *, after: str, language: str) -> str:
    """The first ```language block after the first occurrence of ``after`` (dedented, as a reader pastes it)."""
    start = text.index(after)
    match = re.compile(rf"^([ \t]*)```{re.escape(language)}[ \t]*\n(.*?)^\1```", re.S | re.M).search(text, start)
    if match is None:
        raise ValueError(f"no ```{language} block after {after!r}")
    return textwrap.dedent(match[2])
