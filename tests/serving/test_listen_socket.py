"""Which IP families a listener takes (:func:`ix_gpu.serving.guarded_http.listen_socket`, shared by the
device plugin's and the DRA plugin's /healthz and /metrics port and the webhook's ports).

``::`` (the default) is one dual-stack socket that answers on ``::1`` and on ``127.0.0.1``, with
IPV6_V6ONLY off whatever the host's ``net.ipv6.bindv6only``; where the kernel cannot make an AF_INET6
socket (booted with ``ipv6.disable=1``; simulated here) it binds ``0.0.0.0`` and says so in a warning;
a port in use is no reason to fall back; an explicit address binds its own family only; and a
malformed address is a usage error (exit 2, one line) in each command that takes one.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import socket

import pytest

from ix_gpu.cli import build_parser
from ix_gpu.process.usage import listen_address
from ix_gpu.serving import guarded_http
from ix_gpu.serving.agent_http import start_http_server
from ix_gpu.serving.guarded_http import address_text, listen_socket
from tests.support.cli import ix_gpu

pytestmark = pytest.mark.timeout(60)


def answers(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted (by the listener's backlog)."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def no_ipv6(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make AF_INET6 sockets fail as on a kernel booted with ipv6.disable=1 (EAFNOSUPPORT)."""
    real = guarded_http._stream_socket

    def stream_socket(family: socket.AddressFamily) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family)

    monkeypatch.setattr(guarded_http, "_stream_socket", stream_socket)


def test_this_machine_has_ipv6_loopback() -> None:
    """The tests below that dial ::1 need it; say so plainly rather than fail obscurely."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::1", 0))


def test_the_default_answers_on_both_families(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ix_gpu.serving.guarded_http")
    with listen_socket("::", 0) as sock:
        port = sock.getsockname()[1]
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        assert answers("::1", port) and answers("127.0.0.1", port)
    assert f"listening on [::]:{port}, IPv6 and IPv4" in caplog.text


@pytest.mark.parametrize(
    ("host", "family", "other"),
    [
        ("0.0.0.0", socket.AF_INET, "::1"),
        ("127.0.0.1", socket.AF_INET, "::1"),
        ("::1", socket.AF_INET6, "127.0.0.1"),
    ],
)
def test_an_explicit_address_binds_its_family_only(
    host: str, family: socket.AddressFamily, other: str
) -> None:
    with listen_socket(host, 0) as sock:
        port = sock.getsockname()[1]
        assert sock.family == family
        assert answers(host if host != "0.0.0.0" else "127.0.0.1", port)
        assert not answers(other, port)


def test_without_ipv6_the_default_falls_back_to_ipv4_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    no_ipv6(monkeypatch)
    with listen_socket("::", 0) as sock:
        port = sock.getsockname()[1]
        assert sock.family == socket.AF_INET and sock.getsockname()[0] == "0.0.0.0"
        assert answers("127.0.0.1", port)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"IPv6 unavailable (Address family not supported by protocol): listening on 0.0.0.0:{port}, IPv4 only"
    ]


class Healthy:
    def problems(self) -> list[str]:
        return []

    def notes(self) -> list[str]:
        return []

    def metrics_text(self) -> bytes:
        return b""


def test_without_ipv6_the_node_agents_port_serves_ipv4(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The agents' /healthz and /metrics (what the plugin and the DRA plugin start) take the same path."""
    caplog.set_level(logging.INFO)
    no_ipv6(monkeypatch)

    async def scenario() -> tuple[socket.AddressFamily, int, bool]:
        server = await start_http_server(Healthy(), "::", 0)
        try:
            sock = server.sockets[0]
            port = sock.getsockname()[1]
            return sock.family, port, await asyncio.to_thread(answers, "127.0.0.1", port)
        finally:
            server.close()
            await server.wait_closed()

    family, port, answered = asyncio.run(scenario())
    assert family == socket.AF_INET and answered
    assert f"listening on 0.0.0.0:{port}, IPv4 only" in caplog.text
    assert f"serving /healthz and /metrics on 0.0.0.0:{port}" in caplog.text


def test_without_ipv6_an_explicit_ipv6_address_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the default chooses for the operator; an address they named is never swapped."""
    no_ipv6(monkeypatch)
    with pytest.raises(OSError) as raised:
        listen_socket("::1", 0)
    assert raised.value.errno == errno.EAFNOSUPPORT


def test_a_port_in_use_is_an_error_not_a_fallback(caplog: pytest.LogCaptureFixture) -> None:
    with listen_socket("::", 0) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as raised:
            listen_socket("::", port)
        assert raised.value.errno == errno.EADDRINUSE
        with pytest.raises(OSError):
            listen_socket("0.0.0.0", port)  # the dual-stack socket holds the IPv4 port too
    assert "IPv4 only" not in caplog.text


def test_address_text_brackets_ipv6() -> None:
    assert address_text("::", 9401) == "[::]:9401"
    assert address_text("fd00::5", 80) == "[fd00::5]:80"
    assert address_text("0.0.0.0", 9401) == "0.0.0.0:9401"


@pytest.mark.parametrize("text", ["", " ::", "[::]", "[fd00::5]", "0.0.0.0 "])
def test_malformed_addresses_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        listen_address(text)


def test_defaults_node_agents_both_families_webhook_loopback() -> None:
    """The node agents listen on every address by default; the webhook's own default stays the
    loopback address its development certificates name (the chart passes ``--host=::``)."""
    parser = build_parser()
    assert parser.parse_args(["plugin"]).metrics_host == "::"
    assert parser.parse_args(["dra"]).metrics_host == "::"
    assert parser.parse_args(["webhook"]).host == "127.0.0.1"
    assert parser.parse_args(["webhook", "--host", "fd00::5"]).host == "fd00::5"


@pytest.mark.parametrize(
    "args",
    [["plugin", "--metrics-host", "[::]"], ["dra", "--metrics-host", ""], ["webhook", "--host", "[::]"]],
)
def test_a_malformed_address_is_a_usage_error(args: list[str]) -> None:
    result = ix_gpu(*args, timeout=30)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "address" in result.stderr
