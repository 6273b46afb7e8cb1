"""A loopback TCP proxy that can cut one process's path to a server: a network partition
without root, iptables or a mock. Runs in the test's event loop.

`partition()` black-holes the path: connections stay open (and new ones are accepted) but no byte
gets through either way, the way a lost route looks to a client (time-outs, not refusals).
`heal()` closes what was cut, so clients reconnect cleanly, and forwards again.
"""

from __future__ import annotations

import asyncio
from typing import Any

CHUNK = 65536


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopped = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def partition(self) -> None:
        self.cut = True

    def heal(self) -> None:
        for w in list(self._writers):
            w.close()
        self.cut = False

    async def stop(self) -> None:
        self._stopped = True
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        finally:
            self._tasks.discard(task)
        self._writers.add(up_writer)
        if self._stopped:
            writer.close()
            up_writer.close()
            return
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            pump = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(pump)
            pump.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(CHUNK):
                if self.cut:
                    continue  # swallowed: the partition
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.close()
            self._writers.discard(dst)
