"""The catalog file format: every refused input names its line and field, and the canonical form round-trips."""

import json

import pytest

from store.catalog_format import (
    MAX_PROBLEMS,
    CatalogEntry,
    CatalogFileError,
    CatalogFormat,
    encode_catalog,
    format_of,
    parse_catalog,
)

HEADER = "sku,name,unit_price_cents,currency,active\n"


def _problems(data: bytes, fmt: CatalogFormat = "csv") -> list[str]:
    with pytest.raises(CatalogFileError) as refused:
        parse_catalog(data, fmt)
    return [str(problem) for problem in refused.value.problems]


def _csv(*lines: str) -> bytes:
    return (HEADER + "".join(line + "\n" for line in lines)).encode()


def _jsonl(*documents: object) -> bytes:
    return "".join(json.dumps(document) + "\n" for document in documents).encode()


def _product(**fields: object) -> dict[str, object]:
    return {"sku": "hat-1", "name": "Hat", "unit_price_cents": 100, "currency": "USD"} | fields


ENTRIES = [
    CatalogEntry("COAT-1", 'Coat "Navy", wool', 18900, "USD"),
    CatalogEntry("hat-1", "Hüt ☂ béret", 0, "EUR", active=False),
    CatalogEntry("scarf-1", "Scarf", 2147483647, "GBP"),
]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_canonical_form_parses_back_to_the_same_entries_and_encodes_to_the_same_bytes(fmt: CatalogFormat) -> None:
    data = b"".join(encode_catalog(ENTRIES, fmt))
    parsed = parse_catalog(data, fmt)
    assert parsed == ENTRIES
    assert b"".join(encode_catalog(parsed, fmt)) == data


def test_the_csv_form_is_a_header_row_then_one_quoted_as_needed_line_per_product() -> None:
    assert b"".join(encode_catalog(ENTRIES[:2], "csv")).decode() == (
        HEADER + 'COAT-1,"Coat ""Navy"", wool",18900,USD,true\nhat-1,Hüt ☂ béret,0,EUR,false\n'
    )


def test_active_is_optional_columns_may_come_in_any_order_and_crlf_and_a_byte_order_mark_are_accepted() -> None:
    data = "\ufeffcurrency,unit_price_cents,name,sku\r\nUSD,100,Hat,hat-1\r\n\r\nEUR,5,Pin,pin-1\r\n".encode()
    assert parse_catalog(data, "csv") == [
        CatalogEntry("hat-1", "Hat", 100, "USD"),
        CatalogEntry("pin-1", "Pin", 5, "EUR"),
    ]
    assert parse_catalog(_jsonl(_product()), "jsonl") == [CatalogEntry("hat-1", "Hat", 100, "USD")]
    spreadsheet = _csv("hat-1,Hat,100,USD,TRUE", "hat-2,Hat,100,USD,FALSE", "hat-3,Hat,100,USD,")
    assert [entry.active for entry in parse_catalog(spreadsheet, "csv")] == [True, False, True]


def test_duplicate_skus_name_both_lines() -> None:
    assert _problems(_csv("hat-1,Hat,100,USD,true", "pin-1,Pin,5,USD,true", "hat-1,Other hat,200,USD,true")) == [
        "line 4, sku: 'hat-1' is also on line 2; list each sku once"
    ]
    assert _problems(_jsonl(_product(), _product(name="Again")), "jsonl") == [
        "line 2, sku: 'hat-1' is also on line 1; list each sku once"
    ]


@pytest.mark.parametrize(
    ("currency", "why"),
    [
        ("usd", "'usd' is not an ISO 4217 currency code (three capital letters, such as USD)"),
        ("EURO", "'EURO' is not an ISO 4217 currency code (three capital letters, such as USD)"),
        ("ABC", "ABC is not an ISO 4217 currency code"),
        (
            "JPY",
            "JPY has no two-digit minor unit; prices are whole hundredths (cents) of a currency, so only "
            "currencies with cents (USD, EUR, GBP, …) can be sold",
        ),
        ("", "'' is not an ISO 4217 currency code (three capital letters, such as USD)"),
    ],
)
def test_a_bad_currency_is_refused_with_its_line(currency: str, why: str) -> None:
    assert _problems(_csv("hat-1,Hat,100,USD,true", f"pin-1,Pin,5,{currency},true")) == [f"line 3, currency: {why}"]


@pytest.mark.parametrize(
    ("price", "why"),
    [
        ("-5", "-5 is negative; prices are 0 or more"),
        (
            "12.50",
            "'12.50' is a decimal; prices are whole minor units (cents) with no decimal point: write 1250 for 12.50",
        ),
        (
            "-0.5",
            "'-0.5' is a decimal; prices are whole minor units (cents) with no decimal point: write 50 for 0.5, "
            "and prices cannot be negative",
        ),
        ("1e3", "'1e3' is not a whole number of minor units (cents), e.g. 1250 for 12.50"),
        ("12,50", "'12,50' is not a whole number of minor units (cents), e.g. 1250 for 12.50"),
        ("", "is empty; write the price in minor units (cents), e.g. 1250 for 12.50"),
        ("2147483648", "2147483648 is above the largest price, 2147483647"),
    ],
)
def test_negative_decimal_and_non_integer_prices_are_refused_in_csv(price: str, why: str) -> None:
    assert _problems(_csv(f'pin-1,Pin,"{price}",USD,true')) == [f"line 2, unit_price_cents: {why}"]


@pytest.mark.parametrize(
    ("price", "why"),
    [
        (-5, "-5 is negative; prices are 0 or more"),
        (12.5, "12.5 is a decimal; prices are whole minor units (cents): write 1250 for 12.5"),
        (12.0, "12.0 is not an integer; write 12 (no decimal point)"),
        ("1250", '"1250" is a string; write the price as a JSON integer of minor units (cents)'),
        (True, "true is not a price; write the price in minor units (cents), e.g. 1250"),
        (None, "null is not a price; write the price in minor units (cents), e.g. 1250"),
    ],
)
def test_negative_decimal_and_non_integer_prices_are_refused_in_json_lines(price: object, why: str) -> None:
    assert _problems(_jsonl(_product(unit_price_cents=price)), "jsonl") == [f"line 1, unit_price_cents: {why}"]


def test_over_long_fields_are_refused_with_their_length_and_limit() -> None:
    assert _problems(_csv(f"{'s' * 65},Pin,5,USD,true", f"pin-2,{'n' * 201},5,USD,true")) == [
        "line 2, sku: is 65 characters long; at most 64",
        "line 3, name: is 201 characters long; at most 200",
    ]


def test_control_characters_are_refused_where_they_are() -> None:
    assert _problems(_csv('pin-1,"Pin\nwith a newline",5,USD,true', "pin-2,Tab\there,5,USD,true")) == [
        "line 2, name: contains a control character (U+000A at position 4); remove it",
        "line 4, name: contains a control character (U+0009 at position 4); remove it",
    ]
    assert _problems(_jsonl(_product(sku="hat\u00001"), _product(sku="hat-2", name="Bell\u0007")), "jsonl") == [
        "line 1, sku: contains a control character (U+0000 at position 4); remove it",
        "line 2, name: contains a control character (U+0007 at position 5); remove it",
    ]


def test_a_file_that_is_not_utf8_is_refused_at_each_bad_line_and_field() -> None:
    latin1 = (HEADER + "hat-1,Chapeau,100,EUR,true\nberet-1,Béret,200,EUR,true\npin-1,Épingle,5,EUR,true\n").encode(
        "latin-1"
    )
    assert _problems(latin1) == [
        "line 3, name: is not UTF-8 text (byte 0xE9 at position 2); save the file as UTF-8",
        "line 4, name: is not UTF-8 text (byte 0xC9 at position 1); save the file as UTF-8",
    ]
    assert _problems(
        '{"sku": "pin-1", "name": "Épingle", "unit_price_cents": 5, "currency": "EUR"}\n'.encode("cp1252"), "jsonl"
    ) == ["line 1, name: is not UTF-8 text (byte 0xC9 at position 1); save the file as UTF-8"]


def test_skus_are_printable_ascii_without_spaces_and_names_are_trimmed_and_not_empty() -> None:
    assert _problems(
        _csv("hat 1,Hat,100,USD,true", "hüt-1,Hat,100,USD,true", "hat-3, Hat,100,USD,true", "hat-4,,1,USD,")
    ) == [
        "line 2, sku: may hold printable ASCII characters other than space only (U+0020 at position 4)",
        "line 3, sku: may hold printable ASCII characters other than space only (U+00FC at position 2)",
        "line 4, name: starts or ends with white space; remove it",
        "line 5, name: is empty",
    ]


def test_the_header_must_name_the_columns_and_rows_must_match_it() -> None:
    assert _problems(b"sku,name,price,currency\nhat-1,Hat,1.00,USD\n") == [
        "line 1: unknown column 'price' (the columns are sku, name, unit_price_cents, currency, active; active is "
        "optional); prices go in unit_price_cents, in minor units (cents)",
        "line 1: no 'unit_price_cents' column",
    ]
    assert _problems(_csv("hat-1,Hat,100,USD", "hat-2,Hat,100,USD,maybe")) == [
        "line 2: 4 fields where the header names 5",
        "line 3, active: 'maybe' is neither true nor false (an empty cell means true)",
    ]
    assert _problems(b"") == [
        "line 1: no header row; the first line names the columns: sku,name,unit_price_cents,currency,active"
    ]
    assert _problems(_csv('hat-1,"Hat,100,USD,true')) == [
        "line 2: is not valid CSV (unexpected end of data); nothing after it was read"
    ]


def test_json_lines_must_be_objects_with_the_known_keys() -> None:
    data = (
        b'["hat-1"]\n{"sku": "hat-2"\n'
        + _jsonl(_product(sku="hat-3", price=1), {"sku": "hat-4", "name": "Hat"})
        + b'{"sku": "hat-5", "sku": "hat-6"}\n'
    )
    assert _problems(data, "jsonl") == [
        "line 1: is not a JSON object",
        "line 2: is not a JSON object (Expecting ',' delimiter at column 16)",
        "line 3: unknown key 'price' (the keys are sku, name, unit_price_cents, currency, active); prices go in "
        "unit_price_cents, in minor units (cents)",
        "line 4, unit_price_cents: is missing",
        "line 4, currency: is missing",
        "line 5: is not a usable JSON object (the key 'sku' appears twice)",
    ]


def test_at_most_the_first_fifty_problems_are_kept_and_all_are_counted() -> None:
    with pytest.raises(CatalogFileError) as refused:
        parse_catalog(_csv(*(f"pin-{i},Pin,-1,USD,true" for i in range(80))), "csv")
    assert len(refused.value.problems) == MAX_PROBLEMS
    assert refused.value.total == 80
    assert str(refused.value.problems[-1]) == "line 51, unit_price_cents: -1 is negative; prices are 0 or more"


def test_the_format_comes_from_the_option_or_the_extension() -> None:
    assert format_of("shop.CSV") == "csv"
    assert format_of("shop.jsonl") == "jsonl"
    assert format_of("shop.ndjson") == "jsonl"
    assert format_of("-", "jsonl") == "jsonl"
    with pytest.raises(
        ValueError, match=r"cannot tell the format of 'shop.txt' .* pass --format csv or --format jsonl"
    ):
        format_of("shop.txt")
