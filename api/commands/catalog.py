"""``coatcheck catalog import FILE`` and ``coatcheck catalog export``: the catalog as a file (docs/catalog.md).

Exit status: 0 done (or a dry run), 1 the database failed (nothing was written), 2 the input or the command
line was refused (nothing was written; every problem is printed with its line and field).
"""

import argparse
import os
import sys
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from api.commands.runner import load_settings, run_with_database
from api.settings import DatabaseSettings
from store.catalog_format import FORMATS, CatalogFileError, CatalogFormat, format_of, parse_catalog
from store.catalog_transfer import ImportSummary, export_catalog, import_catalog
from store.errors import Unavailable

__all__ = ["register"]

REFUSED = 2
FAILED = 1


def _fail(message: str, status: int) -> SystemExit:
    print(f"coatcheck: {message}", file=sys.stderr)
    return SystemExit(status)


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or type(exc).__name__}", REFUSED) from None


def describe(summary: ImportSummary) -> str:
    """``added 3, changed 1, unchanged 96, retired 2`` (the first line an import prints)."""
    return f"added {summary.added}, changed {summary.changed}, unchanged {summary.unchanged}, retired {summary.retired}"


def _import(args: argparse.Namespace) -> None:
    try:
        fmt = format_of(args.file, args.format)
    except ValueError as exc:
        raise _fail(str(exc), REFUSED) from None
    data = _read(args.file)
    try:
        entries = parse_catalog(data, fmt)
    except CatalogFileError as refused:
        print(f"coatcheck: {args.file} was refused; nothing was written:", file=sys.stderr)
        for problem in refused.problems:
            print(f"  {problem}", file=sys.stderr)
        if refused.total > len(refused.problems):
            print(f"  … and {refused.total - len(refused.problems)} more problems", file=sys.stderr)
        raise SystemExit(REFUSED) from None
    if args.retire_missing and not entries:
        raise _fail(f"{args.file} lists no products; --retire-missing would retire the whole catalog", REFUSED)
    settings = load_settings(DatabaseSettings)
    try:
        summary = run_with_database(
            settings,
            lambda database: import_catalog(
                database, entries, retire_missing=args.retire_missing, dry_run=args.dry_run
            ),
        )
    except Unavailable as exc:
        raise _fail(f"catalog import failed: {exc}", FAILED) from None
    except (SQLAlchemyError, OSError) as exc:
        # The class only: a driver message may quote the URL.
        raise _fail(f"catalog import failed: {type(exc).__name__}; nothing was written", FAILED) from None
    print(describe(summary) + (" (dry run: nothing was written)" if summary.dry_run else ""))
    if summary.not_listed:
        print(
            f"{summary.not_listed} products on sale are not in the file and stay on sale "
            "(--retire-missing retires them)"
        )


def _export(args: argparse.Namespace) -> None:
    fmt: CatalogFormat = args.format
    settings = load_settings(DatabaseSettings)
    out = sys.stdout.buffer
    try:
        run_with_database(settings, lambda database: export_catalog(database, fmt, out))
        out.flush()
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as Unix tools do; no flush at exit may fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(FAILED) from None
    except Unavailable as exc:
        raise _fail(f"catalog export failed: {exc}", FAILED) from None
    except (SQLAlchemyError, OSError) as exc:
        raise _fail(f"catalog export failed: {type(exc).__name__}", FAILED) from None


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``catalog import`` and ``catalog export`` to the ``coatcheck`` command line."""
    catalog = commands.add_parser(
        "catalog", help="load, change, retire and export the product catalog as a CSV or JSON Lines file"
    ).add_subparsers(dest="catalog_command", required=True)
    load = catalog.add_parser(
        "import",
        help="upsert the products of FILE by sku in one transaction; every problem is reported and nothing "
        "is written unless the whole file is valid",
    )
    load.add_argument("file", metavar="FILE", help="a CSV file with a header row or a JSON Lines file; - reads stdin")
    load.add_argument("--format", choices=FORMATS, default=None, help="the file's format (default: by its extension)")
    load.add_argument("--dry-run", action="store_true", help="print what would change and write nothing")
    load.add_argument(
        "--retire-missing", action="store_true", help="retire every product on sale that FILE does not list"
    )
    load.set_defaults(run=_import)
    dump = catalog.add_parser("export", help="write every product, retired ones included, to standard output")
    dump.add_argument("--format", choices=FORMATS, default="csv", help="csv (default) or jsonl")
    dump.set_defaults(run=_export)
