"""Escaping untrusted text for line-oriented output: the text log and the operator's terminal.

A value that came from outside (a request's method name, a provider's error string, a stored subject) may
hold a CR or LF that forges a line, or an ANSI/OSC sequence that drives the terminal showing it. Before
such a value is written among other lines it goes through :func:`escape_controls`, which replaces every
C0 and C1 control character, DEL, the Unicode line and paragraph separators and the bidirectional
overrides with a visible escape (``\\n``, ``\\x1b``, ``\\u2028``). Printable text, backslashes included,
is left alone, so ordinary values read as they are.
"""

import re

__all__ = ["escape_controls"]

# C0, DEL and C1; U+2028/2029 break lines in many viewers; LRM/RLM, embeddings, overrides and isolates
# reorder what a reader sees ("Trojan Source").
_OTHER_CONTROLS = "\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069"
_ANY_CONTROL = re.compile(f"[\x00-\x1f{_OTHER_CONTROLS}]")
_CONTROL_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHER_CONTROLS}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def escape_controls(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with its control characters escaped; with ``keep_newlines``, LF stays a line break.

    ``keep_newlines`` is for text that is multi-line by nature (a traceback); the caller then marks its
    continuation lines itself, so no line of it can pass for a line of its own.
    """
    pattern = _CONTROL_BUT_NEWLINE if keep_newlines else _ANY_CONTROL
    return pattern.sub(_escaped, text)
