"""Every query names its principal: the one filter and the one set of bind parameters for it.

Statements are built once at import with :func:`owned_by`; each call binds
:func:`principal_params`. Keeping both here means no repository can spell the scope differently.
"""

from sqlalchemy import Table, and_, bindparam
from sqlalchemy.sql.elements import ColumnElement

from store.principal import Principal


def owned_by(table: Table) -> ColumnElement[bool]:
    """``principal_iss = :p_iss AND principal_sub = :p_sub`` on ``table`` (bind with :func:`principal_params`)."""
    return and_(table.c.principal_iss == bindparam("p_iss"), table.c.principal_sub == bindparam("p_sub"))


def principal_params(principal: Principal) -> dict[str, str]:
    """The bind values for :func:`owned_by` and for ``principal_iss``/``principal_sub`` columns on insert."""
    return {"p_iss": principal.issuer, "p_sub": principal.subject}
