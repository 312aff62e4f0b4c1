"""Leaving a load balancer's rotation before stopping: the drain period after SIGTERM.

uvicorn closes its listening socket the moment it is told to stop, so a balancer that still routes to the
replica gets refused connections until its health check notices. With ``SHUTDOWN_DRAIN_SECONDS`` > 0 the
first SIGTERM (or SIGINT) only starts draining: ``/readyz`` answers 503 at once while every request is still
served, and uvicorn's graceful shutdown begins when the period is over. A balancer that checks ``/readyz``
more often than the period takes the replica out before it stops listening. A second signal ends the
drain early.
"""

import time
from types import FrameType

import uvicorn


class Drain:
    """Whether this process has been asked to stop, and when it will stop listening."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._started_at: float | None = None
        self._cut_short = False

    @property
    def draining(self) -> bool:
        """Shutdown has been requested: the process is no longer ready for new work."""
        return self._started_at is not None

    def begin(self) -> None:
        """Start the drain (a repeated call cuts it short)."""
        if self._started_at is None:
            self._started_at = time.monotonic()
        else:
            self._cut_short = True

    def over(self) -> bool:
        """The drain period has passed (or none was started, or it was cut short)."""
        if self._started_at is None or self._cut_short:
            return True
        return time.monotonic() - self._started_at >= self.seconds


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit on a signal waits for the :class:`Drain` period first."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        self.drain = drain
        self._exit_requested = False
        super().__init__(config)

    # uvicorn's main loop polls ``should_exit`` every 0.1 s; holding it false during the drain keeps the
    # listener open without touching uvicorn's own shutdown sequence.
    @property
    def should_exit(self) -> bool:
        return self._exit_requested and self.drain.over()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit_requested = value

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.drain.begin()
        super().handle_exit(sig, frame)
