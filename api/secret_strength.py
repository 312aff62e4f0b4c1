"""A conservative estimate of how hard a configured secret is to guess.

Keys are meant to be machine-generated (``secrets.token_urlsafe(32)``: about 256 bits). The estimate
charges every character the bits of the alphabet the secret draws from, except where a person's
habits show, which are charged almost nothing:

* text that repeats earlier text (``abcdefghij`` four times, ``-correct`` at the end of ``correct…``) costs
  only the few bits that say where the copy starts and how long it is;
* a run of three or more characters that step by the same small amount (``abcd``, ``9876``,
  ``aaaa``) costs the bits of its first character plus a few;
* a run of four or more letters in one case (or capitalised) reads as a word: 2 bits a letter,
  roughly what English text carries.

Random keys lose a few bits to the word rule by chance and stay far above the bar; passphrases,
keyboard walks and repeated patterns fall far below it.
"""

import math
import string

MIN_SECRET_BITS = 128
_ANALYSED_CHARS = 256  # the cost is quadratic; a longer secret is judged by its start
_WORD_BITS_PER_LETTER = 2.0
_MIN_REPEAT = 3
_MIN_WORD = 4
_MAX_STEP = 2
_VOWELS = frozenset("aeiouAEIOU")


def _alphabet_bits(secret: str) -> float:
    size = 0
    if any(c in string.ascii_lowercase for c in secret):
        size += 26
    if any(c in string.ascii_uppercase for c in secret):
        size += 26
    if any(c in string.digits for c in secret):
        size += 10
    if any(not c.isascii() or not c.isalnum() for c in secret):
        size += 33
    return math.log2(max(size, 2))


def _longest_repeat(text: str, start: int) -> tuple[int, int]:
    """Length and offset of the longest earlier copy of ``text[start:]`` (the copy may overlap)."""
    best_length, best_offset = 0, 0
    for origin in range(start):
        length = 0
        while start + length < len(text) and text[origin + length] == text[start + length]:
            length += 1
        if length > best_length:
            best_length, best_offset = length, start - origin
    return best_length, best_offset


def _step_run(text: str, start: int) -> int:
    """Length of the run at ``start`` whose characters all differ from the previous by one small step."""
    if start + 2 >= len(text):
        return 0
    step = ord(text[start + 1]) - ord(text[start])
    if abs(step) > _MAX_STEP:
        return 0
    end = start + 1
    while end + 1 < len(text) and ord(text[end + 1]) - ord(text[end]) == step:
        end += 1
    return end - start + 1


def _letters(text: str, start: int, *, upper: bool) -> int:
    end = start
    while end < len(text) and text[end].isascii() and text[end].isalpha() and text[end].isupper() == upper:
        end += 1
    return end - start


def _segment(text: str, start: int) -> int:
    """Length of the letter segment at ``start``: lower case, upper case, or one capital then lower case."""
    if not (text[start].isascii() and text[start].isalpha()):
        return 0
    if text[start].islower():
        return _letters(text, start, upper=False)
    capitals = _letters(text, start, upper=True)
    return capitals if capitals > 1 else 1 + _letters(text, start + 1, upper=False)


def _pronounceable(segment: str) -> bool:
    # English-like: a vowel in every four letters or better, no cluster of five consonants.
    vowels = sum(c in _VOWELS for c in segment)
    cluster = longest = 0
    for c in segment:
        cluster = 0 if c in _VOWELS else cluster + 1
        longest = max(longest, cluster)
    return len(segment) >= 2 and vowels * 4 >= len(segment) and longest < 5


def _word_run(text: str, start: int) -> int:
    """Length of the words at ``start``: one pronounceable segment of four or more letters, or several
    capitalised ones in a row (CamelCase); a capitals-only segment counts only on its own."""
    total = 0
    position = start
    while position < len(text):
        length = _segment(text, position)
        segment = text[position : position + length]
        if not length or not _pronounceable(segment) or (total and segment.isupper()):
            break
        total += length
        position += length
        if segment.isupper() or position >= len(text) or not text[position].isupper():
            break
    return total if total >= _MIN_WORD else 0


def estimated_entropy_bits(secret: str) -> float:
    """Bits an attacker who knows common human patterns would need to guess ``secret``."""
    text = secret[:_ANALYSED_CHARS]
    per_char = _alphabet_bits(text)
    bits = 0.0
    position = 0
    while position < len(text):
        length, offset = _longest_repeat(text, position)
        if length >= _MIN_REPEAT:
            bits += math.log2(offset + 1) + math.log2(length + 1)
            position += length
            continue
        length = _step_run(text, position)
        if length >= _MIN_REPEAT:
            bits += per_char + 2 + math.log2(length)
            position += length
            continue
        length = _word_run(text, position)
        if length:
            bits += _WORD_BITS_PER_LETTER * length
            position += length
            continue
        bits += per_char
        position += 1
    return bits
