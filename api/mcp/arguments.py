"""Argument types shared by the tools: the input schema refuses what the store must never see.

The SDK validates every call against these before a tool runs, so a NUL byte (which PostgreSQL
cannot store in text) or an integer outside PostgreSQL's ``integer`` becomes a validation error
the caller can read, never a driver exception with a traceback in the log.
"""

from typing import Annotated

from pydantic import Field

from store.paging import MAX_PAGE_SIZE

# No C0 control characters (NUL included) and no DEL in anything that reaches SQL.
NO_CONTROL_CHARACTERS = r"^[^\x00-\x1f\x7f]*$"
INT32_MAX = 2**31 - 1

CartId = Annotated[
    str,
    Field(description="A cart handle returned by cart_create (cart_…)", max_length=200, pattern=NO_CONTROL_CHARACTERS),
]
OrderId = Annotated[
    str,
    Field(
        description="An order handle returned by cart_checkout (ord_…)", max_length=200, pattern=NO_CONTROL_CHARACTERS
    ),
]
Sku = Annotated[
    str, Field(description="A product sku from catalog_search", max_length=64, pattern=NO_CONTROL_CHARACTERS)
]
SearchQuery = Annotated[
    str,
    Field(
        description="Text to find in skus and names (case-insensitive)", max_length=200, pattern=NO_CONTROL_CHARACTERS
    ),
]
Cursor = Annotated[
    str,
    Field(
        description="next_cursor from the previous page of the same list; omit for the newest",
        max_length=300,
        pattern=r"^[A-Za-z0-9_.-]*$",
    ),
]
IdempotencyKey = Annotated[
    str,
    Field(
        description="A key you choose (e.g. a UUID) so that retrying this call returns the same cart "
        "instead of making another",
        min_length=1,
        max_length=100,
        pattern=r"^[\x21-\x7e]+$",
    ),
]
PageSize = Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE, description=f"1..{MAX_PAGE_SIZE} items per page")]
Int32 = Annotated[int, Field(ge=-INT32_MAX - 1, le=INT32_MAX)]
