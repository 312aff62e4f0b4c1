"""Table definitions, one module per aggregate. Migrations are written by hand; a test proves they
match these models.

Every table that holds user data carries the owning principal (issuer, subject), so every query can
be scoped to it and the data could later be distributed by principal. Importing this package
registers every table on ``Base.metadata``.
"""

from store.models.authserver import AsAuthorizationCode, AsClient, AsConsent, AsGrant, AsRefreshToken
from store.models.base import Base, table_of
from store.models.browser import BrowserSession
from store.models.carts import Cart, CartItem, Product
from store.models.connections import AuditEvent, OAuthFlow, ProviderConnection
from store.models.orders import Order, OrderLine

__all__ = [
    "AsAuthorizationCode",
    "AsClient",
    "AsConsent",
    "AsGrant",
    "AsRefreshToken",
    "AuditEvent",
    "Base",
    "BrowserSession",
    "Cart",
    "CartItem",
    "OAuthFlow",
    "Order",
    "OrderLine",
    "Product",
    "ProviderConnection",
    "table_of",
]
