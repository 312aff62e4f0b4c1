"""The catalog file format of ``coatcheck catalog import`` and ``export``: CSV with a header row, or JSON Lines.

Parsing validates every line before anything is written and reports each problem with its line number and
field (the first :data:`MAX_PROBLEMS`); writing produces the canonical form, so a file written by
:func:`encode_entries` parses back to the same entries and encodes to the same bytes. The format is
documented in docs/catalog.md; keep the two in step.
"""

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

CatalogFormat = Literal["csv", "jsonl"]
FORMATS: tuple[CatalogFormat, ...] = ("csv", "jsonl")
_SUFFIXES: dict[str, CatalogFormat] = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}

COLUMNS = ("sku", "name", "unit_price_cents", "currency", "active")
REQUIRED_COLUMNS = COLUMNS[:4]
MAX_SKU_LENGTH = 64  # product.sku is varchar(64)
MAX_NAME_LENGTH = 200
MAX_PRICE = 2**31 - 1  # product.unit_price_cents is an integer
MAX_PROBLEMS = 50

# ISO 4217 codes whose minor unit is two digits. Prices are whole hundredths (cents) of the currency and are
# shown as such (api/mcp/tools_orders.py, money), so a currency without cents (JPY) or with thousandths (KWD)
# would be priced and shown wrongly: those are refused.
TWO_DIGIT_CURRENCIES = frozenset(
    """
    AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BMD BND BOB BRL BSD BTN BWP BYN BZD CAD CDF CHF
    CNY COP CRC CUP CVE CZK DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GTQ GYD HKD HNL HTG HUF
    IDR ILS INR IRR JMD KES KGS KHR KPW KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR
    MWK MXN MYR MZN NAD NGN NIO NOK NPR NZD PAB PEN PGK PHP PKR PLN QAR RON RSD RUB SAR SBD SCR SDG SEK SGD
    SHP SLE SLL SOS SRD SSP STN SVC SYP SZL THB TJS TMT TOP TRY TTD TWD TZS UAH USD UYU UZS VED VES WST XCD
    XCG YER ZAR ZMW ZWG ZWL
    """.split()  # noqa: SIM905 - a table is easier to check against ISO 4217 than a list of quoted strings
)
OTHER_MINOR_UNITS = frozenset(
    "BHD BIF CLF CLP DJF GNF IQD ISK JOD JPY KMF KRW KWD LYD OMR PYG RWF TND UGX UYI UYW VND VUV XAF XOF XPF".split()  # noqa: SIM905
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NOT_UTF8 = re.compile(r"[\udc80-\udcff]")  # what surrogateescape decodes an invalid byte to
_SKU_CHARACTERS = re.compile(r"[!-~]+")  # printable ASCII, no space: lower() means the same in every locale
_DIGITS = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"-?[0-9]*\.[0-9]+|-?[0-9]+\.[0-9]*")
_CURRENCY_SHAPE = re.compile(r"[A-Z]{3}")


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One product as a catalog file lists it."""

    sku: str
    name: str
    unit_price_cents: int
    currency: str
    active: bool = True


@dataclass(frozen=True, slots=True)
class Problem:
    """Why one line (and, where it is one field's fault, which field) cannot be imported."""

    line: int
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" + (f", {self.field}" if self.field else "")
        return f"{where}: {self.message}"


class CatalogFileError(Exception):
    """The file was refused; ``problems`` holds the first :data:`MAX_PROBLEMS` of ``total``."""

    def __init__(self, problems: list[Problem], total: int) -> None:
        super().__init__(f"{total} problem(s), first: {problems[0]}" if problems else "refused")
        self.problems = problems
        self.total = total


def format_of(filename: str, explicit: CatalogFormat | None = None) -> CatalogFormat:
    """The format named by ``explicit``, else by the file name's extension (.csv, .jsonl, .ndjson).

    Raises:
        ValueError: no format given and the extension names none (the message says what to pass).
    """
    if explicit is not None:
        return explicit
    lowered = filename.lower()
    for suffix, found in _SUFFIXES.items():
        if lowered.endswith(suffix):
            return found
    raise ValueError(
        f"cannot tell the format of {filename!r} from its name (.csv or .jsonl); pass --format csv or --format jsonl"
    )


class _Problems:
    """Collects problems, keeping the first MAX_PROBLEMS and counting the rest."""

    def __init__(self) -> None:
        self.kept: list[Problem] = []
        self.total = 0

    def add(self, line: int, field: str | None, message: str) -> None:
        self.total += 1
        if len(self.kept) < MAX_PROBLEMS:
            self.kept.append(Problem(line, field, message))


def _char(text: str, at: int) -> str:
    return f"U+{ord(text[at]):04X} at position {at + 1}"


def _text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text: bytes that were not UTF-8, or a control character."""
    bad = _NOT_UTF8.search(value)
    if bad is not None:
        byte = ord(bad.group()) - 0xDC00
        return f"is not UTF-8 text (byte 0x{byte:02X} at position {bad.start() + 1}); save the file as UTF-8"
    control = _CONTROL.search(value)
    if control is not None:
        return f"contains a control character ({_char(value, control.start())}); remove it"
    return None


def _sku_problem(value: str) -> str | None:
    if not value:
        return "is empty"
    if (why := _text_problem(value)) is not None:
        return why
    if len(value) > MAX_SKU_LENGTH:
        return f"is {len(value)} characters long; at most {MAX_SKU_LENGTH}"
    if not _SKU_CHARACTERS.fullmatch(value):
        at = next(i for i, ch in enumerate(value) if not _SKU_CHARACTERS.fullmatch(ch))
        return f"may hold printable ASCII characters other than space only ({_char(value, at)})"
    return None


def _name_problem(value: str) -> str | None:
    if not value.strip():
        return "is empty"
    if (why := _text_problem(value)) is not None:
        return why
    if len(value) > MAX_NAME_LENGTH:
        return f"is {len(value)} characters long; at most {MAX_NAME_LENGTH}"
    if value != value.strip():
        return "starts or ends with white space; remove it"
    return None


def _price_from_text(value: str) -> int | str:
    """The price in a CSV cell, or why it is refused."""
    if _DIGITS.fullmatch(value):
        return _price_in_range(int(value))
    if _DECIMAL.fullmatch(value):
        whole = value.lstrip("-")
        cents = round(float(whole) * 100)
        return (
            f"{value!r} is a decimal; prices are whole minor units (cents) with no decimal point: "
            f"write {cents} for {whole}" + (", and prices cannot be negative" if value.startswith("-") else "")
        )
    if re.fullmatch(r"-[0-9]+", value):
        return f"{value} is negative; prices are 0 or more"
    if not value:
        return "is empty; write the price in minor units (cents), e.g. 1250 for 12.50"
    if (why := _text_problem(value)) is not None:
        return why
    return f"{value!r} is not a whole number of minor units (cents), e.g. 1250 for 12.50"


def _price_from_json(value: object) -> int | str:
    if isinstance(value, bool) or value is None:
        return f"{json.dumps(value)} is not a price; write the price in minor units (cents), e.g. 1250"
    if isinstance(value, int):
        return _price_in_range(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"{value!r} is not a price; write a JSON integer of minor units (cents)"
        if value.is_integer():
            return f"{value!r} is not an integer; write {int(value)} (no decimal point)"
        return (
            f"{value!r} is a decimal; prices are whole minor units (cents): write {round(abs(value) * 100)} "
            f"for {abs(value)}" + (", and prices cannot be negative" if value < 0 else "")
        )
    if isinstance(value, str):
        return f"{json.dumps(value)} is a string; write the price as a JSON integer of minor units (cents)"
    return f"{json.dumps(value)} is not a price; write a JSON integer of minor units (cents)"


def _price_in_range(value: int) -> int | str:
    if value < 0:
        return f"{value} is negative; prices are 0 or more"
    if value > MAX_PRICE:
        return f"{value} is above the largest price, {MAX_PRICE}"
    return value


def _currency_problem(value: str) -> str | None:
    if value in TWO_DIGIT_CURRENCIES:
        return None
    if value in OTHER_MINOR_UNITS:
        return (
            f"{value} has no two-digit minor unit; prices are whole hundredths (cents) of a currency, so only "
            "currencies with cents (USD, EUR, GBP, …) can be sold"
        )
    if (why := _text_problem(value)) is not None:
        return why
    if _CURRENCY_SHAPE.fullmatch(value):
        return f"{value} is not an ISO 4217 currency code"
    return f"{value!r} is not an ISO 4217 currency code (three capital letters, such as USD)"


def _active_from_text(value: str) -> bool | str:
    spelled = value.lower()  # spreadsheets write TRUE and FALSE
    if spelled in {"true", ""}:
        return True
    if spelled == "false":
        return False
    return f"{value!r} is neither true nor false (an empty cell means true)"


class _Reader:
    """Validates fields into entries, line by line, and remembers where each sku was first listed."""

    def __init__(self) -> None:
        self.problems = _Problems()
        self.entries: list[CatalogEntry] = []
        self._first_line: dict[str, int] = {}

    def entry(self, line: int, sku: Any, name: Any, price: int | str, currency: Any, active: bool | str) -> None:
        before = self.problems.total
        for field, value, check in (("sku", sku, _sku_problem), ("name", name, _name_problem)):
            if not isinstance(value, str):
                self.problems.add(line, field, f"{json.dumps(value)} is not a string")
            elif (why := check(value)) is not None:
                self.problems.add(line, field, why)
        if isinstance(price, str):
            self.problems.add(line, "unit_price_cents", price)
        if not isinstance(currency, str):
            self.problems.add(line, "currency", f"{json.dumps(currency)} is not a string")
        elif (why := _currency_problem(currency)) is not None:
            self.problems.add(line, "currency", why)
        if isinstance(active, str):
            self.problems.add(line, "active", active)
        if isinstance(sku, str):
            first = self._first_line.setdefault(sku, line)
            if first != line:
                self.problems.add(line, "sku", f"{sku!r} is also on line {first}; list each sku once")
        if self.problems.total == before:
            assert isinstance(price, int)  # noqa: S101 - checked above
            assert isinstance(active, bool)  # noqa: S101
            self.entries.append(CatalogEntry(sku, name, price, currency, active))

    def result(self) -> list[CatalogEntry]:
        if self.problems.total:
            raise CatalogFileError(self.problems.kept, self.problems.total)
        return self.entries


def _decode(data: bytes) -> str:
    # Invalid bytes become lone surrogates, so each is reported on its own line and field (_text_problem).
    text = data.decode("utf-8", errors="surrogateescape")
    return text.removeprefix("\ufeff")  # a byte order mark, as spreadsheets write


def parse_catalog(data: bytes, fmt: CatalogFormat) -> list[CatalogEntry]:
    """The entries of a catalog file, in file order.

    Raises:
        CatalogFileError: anything in the file is wrong; nothing is returned then.
    """
    text = _decode(data)
    return _parse_csv(text) if fmt == "csv" else _parse_jsonl(text)


def _parse_csv(text: str) -> list[CatalogEntry]:
    reader = _Reader()
    rows = csv.reader(io.StringIO(text, newline=""), strict=True)
    columns: dict[str, int] | None = None
    line = 0
    try:
        for row in rows:
            start, line = line + 1, rows.line_num
            if not row:
                continue  # a blank line
            if columns is None:
                columns = _header(row, start, reader.problems)
                if columns is None:
                    break
                continue
            if len(row) != len(columns):
                reader.problems.add(start, None, f"{len(row)} fields where the header names {len(columns)}")
                continue
            price = _price_from_text(row[columns["unit_price_cents"]])
            active = _active_from_text(row[columns["active"]]) if "active" in columns else True
            reader.entry(start, row[columns["sku"]], row[columns["name"]], price, row[columns["currency"]], active)
    except csv.Error as exc:
        reader.problems.add(line + 1, None, f"is not valid CSV ({exc}); nothing after it was read")
    if columns is None and not reader.problems.total:
        reader.problems.add(1, None, f"no header row; the first line names the columns: {','.join(COLUMNS)}")
    return reader.result()


def _header(row: list[str], line: int, problems: _Problems) -> dict[str, int] | None:
    names = [name.strip() for name in row]
    columns: dict[str, int] = {}
    for at, name in enumerate(names):
        if name in columns:
            problems.add(line, None, f"the column {name!r} is named twice")
        elif name not in COLUMNS:
            hint = "; prices go in unit_price_cents, in minor units (cents)" if "price" in name.lower() else ""
            problems.add(
                line, None, f"unknown column {name!r} (the columns are {', '.join(COLUMNS)}; active is optional){hint}"
            )
        columns[name] = at
    for name in REQUIRED_COLUMNS:
        if name not in columns:
            problems.add(line, None, f"no {name!r} column")
    return None if problems.total else columns


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    doubled = sorted({key for key in keys if keys.count(key) > 1})
    if doubled:
        raise ValueError(f"the key {doubled[0]!r} appears twice")
    return dict(pairs)


def _parse_jsonl(text: str) -> list[CatalogEntry]:
    reader = _Reader()
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue  # a blank line, or the end of the last one
        try:
            value = json.loads(line, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as exc:
            reader.problems.add(number, None, f"is not a JSON object ({exc.msg} at column {exc.colno})")
            continue
        except ValueError as exc:  # a key given twice (_no_duplicate_keys)
            reader.problems.add(number, None, f"is not a usable JSON object ({exc})")
            continue
        if not isinstance(value, dict):
            reader.problems.add(number, None, "is not a JSON object")
            continue
        unknown = sorted(set(value) - set(COLUMNS))
        missing = [key for key in REQUIRED_COLUMNS if key not in value]
        if unknown or missing:
            for key in unknown:
                hint = "; prices go in unit_price_cents, in minor units (cents)" if "price" in key.lower() else ""
                reader.problems.add(number, None, f"unknown key {key!r} (the keys are {', '.join(COLUMNS)}){hint}")
            for key in missing:
                reader.problems.add(number, key, "is missing")
            continue
        active = value.get("active", True)
        reader.entry(
            number,
            value["sku"],
            value["name"],
            _price_from_json(value["unit_price_cents"]),
            value["currency"],
            active if isinstance(active, bool) else f"{json.dumps(active)} is neither true nor false",
        )
    return reader.result()


def header(fmt: CatalogFormat) -> bytes:
    """What a file starts with before its first entry (the CSV header row; nothing for JSON Lines)."""
    return (",".join(COLUMNS) + "\n").encode() if fmt == "csv" else b""


def encode_entries(entries: Iterable[CatalogEntry], fmt: CatalogFormat) -> bytes:
    """``entries`` in the canonical form of ``fmt`` (after :func:`header`), UTF-8, one per ``\\n``-ended line."""
    buffer = io.StringIO()
    if fmt == "csv":
        writer = csv.writer(buffer, lineterminator="\n")
        for e in entries:
            writer.writerow((e.sku, e.name, e.unit_price_cents, e.currency, "true" if e.active else "false"))
    else:
        for e in entries:
            document = {
                "sku": e.sku,
                "name": e.name,
                "unit_price_cents": e.unit_price_cents,
                "currency": e.currency,
                "active": e.active,
            }
            buffer.write(json.dumps(document, ensure_ascii=False, separators=(",", ":")))
            buffer.write("\n")
    return buffer.getvalue().encode()


def encode_catalog(entries: Iterable[CatalogEntry], fmt: CatalogFormat) -> Iterator[bytes]:
    """A whole file: the header, then the entries."""
    yield header(fmt)
    yield encode_entries(entries, fmt)
