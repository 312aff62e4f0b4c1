"""A TCP proxy in the test's own event loop that a test can point elsewhere or cut, like a failing network.

It forwards ``127.0.0.1:<port>`` to a target; :meth:`TcpProxy.retarget` sends new connections elsewhere
while the open ones stay where they were (a proxy that does not cut sessions to a demoted primary);
:meth:`cut` aborts every open connection at once (a connection lost with a statement in flight);
``mode = "hang-up"`` accepts and closes at once (HAProxy while every backend is down).
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

_CHUNK = 65536


@dataclass
class TcpProxy:
    """A running proxy; :attr:`url_for` renders a PostgreSQL URL through it."""

    port: int
    target: tuple[str, int]
    mode: Literal["forward", "hang-up"] = "forward"
    _open: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def url_for(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def retarget(self, port: int, host: str = "127.0.0.1") -> None:
        """New connections go to ``host:port``; open ones keep their server."""
        self.target = (host, port)

    @property
    def open_connections(self) -> int:
        return len(self._open) // 2

    def cut(self) -> int:
        """Abort every open connection (both sides); how many client connections were cut."""
        cut = self.open_connections
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()
        return cut

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(_CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()
            self._open.discard(writer)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.mode == "hang-up":
            client_writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._open |= {client_writer, server_writer}
        for task in (
            asyncio.create_task(self._pipe(client_reader, server_writer)),
            asyncio.create_task(self._pipe(server_reader, client_writer)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


@contextlib.asynccontextmanager
async def tcp_proxy(target_port: int, target_host: str = "127.0.0.1") -> AsyncIterator[TcpProxy]:
    """Start a proxy on a free loopback port forwarding to ``target_host:target_port``; stop it at the end."""
    proxy = TcpProxy(port=0, target=(target_host, target_port))
    server = await asyncio.start_server(proxy._serve, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        proxy.cut()
        await server.wait_closed()
        for task in list(proxy._tasks):
            task.cancel()
        await asyncio.gather(*proxy._tasks, return_exceptions=True)
