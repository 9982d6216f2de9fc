"""Clients that hold a server's connections, and the clients that must still get through.

- :class:`Squatter`: N keep-alive TLS connections from one source address, each sending one tiny
  request every ``interval`` seconds (or nothing at all), reconnecting when the server closes one:
  what any pod that can reach a Service can do to its connection cap.
- :class:`KubeletProber`: a new connection for every probe with a 1 s timeout, as the kubelet's
  HTTP prober does (it turns keep-alive off), over plain HTTP or HTTPS.
- :func:`new_client`: one fresh TLS connection, one request, as the apiserver's next connection.

The squatter and the prober run on threads of the test process; the server is another process.
Source addresses other than 127.0.0.1 (127.0.0.2, ...) stand for other pods: Linux routes all of
127.0.0.0/8 to the loopback device.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.https_client import Answer, NoAnswer, host_port, read_response, request_head
from tests.support.webhook_process import ca_context

TINY_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


async def _read_answer(reader: asyncio.StreamReader) -> int:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
    length = head.split("content-length:", 1)[1].split("\r\n", 1)[0] if "content-length:" in head else "0"
    await reader.readexactly(int(length))
    return int(head.split(" ", 2)[1])


class Squatter:
    """``count`` connections from ``source`` to ``url``, kept open until :meth:`stop`.

    ``interval``: seconds between the requests on each connection, the first one sent as soon as
    the connection is made; None: the connections send nothing.
    ``retry_after``: seconds before a connection the server closed is made again."""

    def __init__(
        self,
        url: str,
        ca_file: Path,
        count: int,
        interval: float | None,
        source: str = "127.0.0.1",
        retry_after: float = 1.0,
    ) -> None:
        self.host, self.port = host_port(url)
        self.context = ca_context(ca_file)
        self.count = count
        self.interval = interval
        self.source = source
        self.retry_after = retry_after
        self.connections = 0
        """TLS connections made (the server closing one makes the squatter open another)."""
        self.closed_by_server = 0
        self.answers = 0
        self.open = 0
        self.peak_open = 0
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Squatter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_open(self, timeout: float) -> None:
        """Until all ``count`` connections have been made once (some may be closed already)."""
        deadline = time.monotonic() + timeout
        while self.connections < self.count and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        starting = asyncio.Semaphore(16)  # handshakes at a time, as a client library's pool would
        tasks = [asyncio.create_task(self._hold(starting)) for _ in range(self.count)]
        await self._stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _hold(self, starting: asyncio.Semaphore) -> None:
        while not self._stop.is_set():
            writer = None
            try:
                async with starting:
                    reader, writer = await asyncio.open_connection(
                        self.host,
                        self.port,
                        ssl=self.context,
                        server_hostname=self.host,
                        local_addr=(self.source, 0),
                    )
                self.connections += 1
                self.open += 1
                self.peak_open = max(self.peak_open, self.open)
                try:
                    await self._use(reader, writer)
                finally:
                    self.open -= 1
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass
            finally:
                if writer is not None:
                    writer.transport.abort()
            self.closed_by_server += 1
            await asyncio.sleep(self.retry_after)

    async def _use(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.interval is None:
            await reader.read(1)  # returns when the server closes the connection
            return
        while True:
            writer.write(TINY_REQUEST)
            await _read_answer(reader)
            self.answers += 1
            await asyncio.sleep(self.interval)


@dataclass
class ProbeRecord:
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.latencies) + len(self.failures)

    def summary(self, name: str) -> str:
        if not self.latencies:
            return f"{name}: {len(self.failures)} failures, no successes"
        return (
            f"{name}: {self.count} probes, {len(self.failures)} failures, max "
            f"{max(self.latencies) * 1000:.1f} ms, median {statistics.median(self.latencies) * 1000:.1f} ms"
        )


class KubeletProber:
    """Probes ``url`` + ``path`` every ``interval`` seconds from a thread, a new connection each
    time, failing a probe that takes over ``timeout`` (the kubelet's default timeoutSeconds: 1)."""

    def __init__(
        self, url: str, path: str, ca_file: Path | None = None, interval: float = 0.25, timeout: float = 1.0
    ) -> None:
        self.host, self.port = host_port(url)
        self.context = ca_context(ca_file) if url.startswith("https:") and ca_file is not None else None
        self.path = path
        self.interval = interval
        self.timeout = timeout
        self.record = ProbeRecord()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> KubeletProber:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                answer = self._probe()
                seconds = time.perf_counter() - started
                if answer.status != 200:
                    self.record.failures.append(f"HTTP {answer.status}")
                elif seconds > self.timeout:
                    self.record.failures.append(f"slow: {seconds:.2f} s")
                else:
                    self.record.latencies.append(seconds)
            except (OSError, NoAnswer) as exc:
                self.record.failures.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)

    def _probe(self) -> Answer:
        raw = socket.create_connection((self.host, self.port), timeout=self.timeout)
        with contextlib.closing(raw):
            sock = raw if self.context is None else self.context.wrap_socket(raw, server_hostname=self.host)
            with contextlib.closing(sock):
                sock.sendall(
                    f"GET {self.path} HTTP/1.1\r\nHost: {self.host}\r\nConnection: close\r\n\r\n".encode()
                )
                return read_response(sock)


def new_client(url: str, ca_file: Path, body: bytes, timeout: float = 5.0) -> str:
    """One new TLS connection, one POST of ``body`` to /mutate: ``HTTP <status>``, or what went
    wrong (the connection closed after the handshake is what a locked-out client sees)."""
    host, port = host_port(url)
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
        with contextlib.closing(raw), ca_context(ca_file).wrap_socket(raw, server_hostname=host) as sock:
            sock.sendall(request_head(length=len(body)) + body)
            return f"HTTP {read_response(sock).status}"
    except NoAnswer:
        return "closed"
    except (OSError, ssl.SSLError) as exc:
        return type(exc).__name__
