"""The error the compose emulation raises where ``docker compose up`` would fail."""


class ComposeUpError(RuntimeError):
    """What ``docker compose up`` would have reported: a service failed, exited or stayed unhealthy."""
