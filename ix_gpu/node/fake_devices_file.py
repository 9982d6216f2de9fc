"""The fake backend's devices file, watched and validated the way the node agents read their
ix-config: re-read on every poll, compared by content, validated in a short-lived child (the
schema is pydantic, which the agents never import), the last good content kept when an edit is bad.

This is process plumbing, so it lives in the node layer and not beside the backend: the backend
(:class:`ix_gpu.node.backends.fake.FakeBackend`) only reads what this hands it.
"""

from __future__ import annotations

from pathlib import Path

from ix_gpu.config.input_files import ConfigError
from ix_gpu.node.backends.fake import FakeBackend
from ix_gpu.node.backends.fake_scan import FakeScan
from ix_gpu.process.isolated import IsolatedCallError, call_isolated
from ix_gpu.process.reload import LastGoodFiles


def fake_backend(path: str | Path) -> FakeBackend:
    """The fake backend over ``path``; raises :class:`~ix_gpu.node.backends.base.BackendError`
    when the file is unreadable or invalid at start, where a usage error is still possible."""
    path = Path(path)
    return FakeBackend(
        LastGoodFiles("fake devices", [path], lambda contents: scan_isolated(contents[0], str(path)))
    )


def scan_isolated(content: bytes | str, source: str) -> FakeScan:
    """Validate in a short-lived child (:mod:`ix_gpu.process.isolated`)."""
    try:
        return call_isolated(_scan, content, source, inline_if_loaded="pydantic")
    except IsolatedCallError as exc:
        raise ConfigError(f"{source}: cannot validate: {exc}") from None


def _scan(content: bytes | str, source: str) -> FakeScan:  # runs in the child
    from ix_gpu.node.backends.fake_devices import scan

    return scan(content, source)
