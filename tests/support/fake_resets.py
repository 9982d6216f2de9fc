"""The fake backend's GPU resets, as a test sets and reads them: a chip's ``reset:`` entry in the
devices file (how its reset goes) and ``<devices file>.resets`` (one line per reset that went
through, the chips' UUIDs; :mod:`ix_gpu.node.backends.fake`)."""

from __future__ import annotations

from pathlib import Path

import yaml


def chip_reset(devices: Path, uuid: str, **how: object) -> None:
    """Give chip ``uuid`` of the devices file a ``reset:`` entry (``fails``, ``seconds``, ``uuidAfter``)."""
    document = yaml.safe_load(devices.read_text())
    for board in document["boards"]:
        for chip in board["chips"]:
            if chip["uuid"] == uuid:
                chip["reset"] = how
    devices.write_text(yaml.safe_dump(document))


def resets(devices: Path) -> list[list[str]]:
    """Every reset the fake backend did, in order: the chips' UUIDs of each."""
    log = devices.with_name(devices.name + ".resets")
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []
