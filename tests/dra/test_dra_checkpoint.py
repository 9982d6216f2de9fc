"""The prepared-claims checkpoint on disk: what a restarted plugin reads back, and the file's form."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ix_gpu.dra.checkpoint import KIND, VERSION, Checkpoint, PreparedClaim, PreparedDevice


def _claim(n: int, share: str | None = None) -> PreparedClaim:
    device = PreparedDevice(
        request_names=("gpu",),
        pool="node1",
        device=f"gpu-{n}",
        cdi_device_ids=(f"iluvatar.com/gpu=uid-{n}-gpu-{n}",),
        share_id=share,
    )
    return PreparedClaim(f"uid-{n}", "default", f"claim-{n}", (device,), f"/var/run/cdi/claim-{n}.json")


def test_saved_claims_are_read_back_by_a_restarted_plugin(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path)
    for n in range(3):
        checkpoint.claims[f"uid-{n}"] = _claim(n, share="5e1f" if n == 1 else None)
        checkpoint.save()
    del checkpoint.claims["uid-0"]
    checkpoint.claims["uid-2"] = dataclasses.replace(_claim(2), name="renamed")
    checkpoint.save()
    assert Checkpoint(path).claims == checkpoint.claims
    raw = json.loads(path.read_text())
    assert (raw["kind"], raw["version"], list(raw["claims"])) == (KIND, VERSION, ["uid-1", "uid-2"])
    # Each claim is stored as its dataclass fields, so the file reads the same as before the
    # hand-built form replaced dataclasses.asdict (files of earlier versions stay readable).
    as_dicts = {uid: dataclasses.asdict(claim) for uid, claim in checkpoint.claims.items()}
    assert raw["claims"] == json.loads(json.dumps(as_dicts))
    assert not [p for p in tmp_path.iterdir() if p.name != "checkpoint.json"]  # no temporary left


def test_an_indented_file_of_an_earlier_version_is_read(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    claims = {"uid-7": _claim(7)}
    document = {
        "kind": KIND,
        "version": VERSION,
        "claims": {uid: dataclasses.asdict(c) for uid, c in claims.items()},
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    assert Checkpoint(path).claims == claims
