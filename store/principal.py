"""Who owns a row: the (issuer, subject) pair of a verified access token."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated end user, unique per authorization server.

    Only a verified token may produce one; nothing in a request body, header or
    handle ever does.
    """

    issuer: str
    subject: str

    def __post_init__(self) -> None:
        if not self.issuer or not self.subject:
            raise ValueError("a principal needs both an issuer and a subject")
