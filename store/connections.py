"""The connection store's public names, re-exported from the modules that hold them.

The vault repository is :mod:`store.vault`, the refresh lease :mod:`store.token_refresh`, key
rotation :mod:`store.key_rotation`. This module keeps code written against the former single
module importing; new code imports from those three.
"""

from store.errors import InvalidGrant
from store.key_rotation import count_stale, reencrypt_all
from store.vault import ConnectionInfo, ConnectionRepository, StoredConnection, TokenSet

__all__ = [
    "ConnectionInfo",
    "ConnectionRepository",
    "InvalidGrant",
    "StoredConnection",
    "TokenSet",
    "count_stale",
    "reencrypt_all",
]
