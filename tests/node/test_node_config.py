"""Which named config a node uses (label, default, the only one) and what a wrong label does."""

from __future__ import annotations

import os
from pathlib import Path

from ix_gpu.node.node_config import choose, named_configs


def test_a_mounted_configmap_directory_lists_its_keys_not_its_symlink_plumbing(tmp_path: Path) -> None:
    # How the kubelet lays out a ConfigMap volume: ..<timestamp>/ with the files, ..data -> it, and
    # one symlink per key.
    data = tmp_path / "..2026_11_30_21_00_00.1"
    data.mkdir()
    for key in ("default", "mixed-a100"):
        (data / key).write_text("version: v1\n")
    os.symlink(data.name, tmp_path / "..data")
    for key in ("default", "mixed-a100"):
        os.symlink(f"..data/{key}", tmp_path / key)
    assert list(named_configs(tmp_path)) == ["default", "mixed-a100"]


def test_the_node_label_picks_the_config() -> None:
    choice = choose({"default", "split"}, "split", None)
    assert choice.name == "split" and "ix-gpu.io/device-plugin.config=split" in choice.reason


def test_without_a_label_the_default_applies() -> None:
    assert choose({"default", "split"}, None, None).name == "default"
    assert choose({"a", "b"}, None, "b").name == "b"
    assert choose({"only"}, None, None).name == "only"
    assert choose({"a", "b"}, "", None).name is None  # an empty label is no label; no default


def test_a_label_naming_no_config_keeps_the_one_in_use_and_says_which_exist() -> None:
    choice = choose({"default", "split"}, "splt", None)
    assert choice.name is None
    assert "names no config" in choice.reason and "default, split" in choice.reason


def test_a_missing_default_is_named() -> None:
    choice = choose({"a"}, None, "b")
    assert choice.name is None and "'b' is not in the ConfigMap" in choice.reason
