"""The one strict YAML loader: duplicate keys, alias bombs, depth, size, and one-line errors.

Every rule is checked on both loader classes: the libyaml one that runs in practice and the pure
Python one used without libyaml (or with a libyaml that does not bound nesting itself).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ix_gpu.config import yaml_input
from ix_gpu.config.input_files import ConfigError, YamlInputError, read_capped
from ix_gpu.config.plugin_config import load_plugin_config
from ix_gpu.config.schema_base import parse_yaml
from ix_gpu.config.webhook_config import load_config
from ix_gpu.config.yaml_input import load_yaml, load_yaml_documents
from ix_gpu.node.backends.fake_devices import FakeDevices, parse_fake_devices
from tests.support.paths import EXAMPLES
from tests.support.yaml_bombs import laughs

LOADERS = ["libyaml", "python"] if yaml.__with_libyaml__ else ["python"]


@pytest.fixture(params=LOADERS, autouse=True)
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "python":
        monkeypatch.setattr(yaml_input, "_loader_class", yaml_input._PyLoader)
    yield request.param


def test_libyaml_is_used_when_present(loader: str) -> None:
    if loader == "libyaml":  # and it bounds nesting itself, so the C composer is safe to use
        assert yaml_input._loader_class.__name__ == "_CLoader"
    assert load_yaml("a: [1, {b: c}]\n", "x") == {"a": [1, {"b": "c"}]}


def refused(content: bytes | str, **kwargs: int) -> str:
    """The error message, checked to be one line naming the source."""
    with pytest.raises(YamlInputError) as caught:
        load_yaml(content, "src.yaml", **kwargs)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("src.yaml: ")
    assert isinstance(caught.value, ConfigError)  # every existing handler catches it
    return message


# --- duplicate keys -------------------------------------------------------------------------------


TWO_POLICIES = """\
apiVersion: ix-gpu.io/v1alpha1
kind: WebhookConfig
policy:
  privilegedNamespaces: [ml-team]
profiles: []
policy:
  privilegedNamespaces: ["*"]
"""


def test_a_second_policy_block_is_an_error_naming_key_line_and_file(tmp_path: Path) -> None:
    path = tmp_path / "webhook.yaml"
    path.write_text(TWO_POLICIES)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert "duplicate key 'policy'" in message
    assert "line 6" in message and "first on line 3" in message


def test_plugin_config_replicas_twice_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "ix-config"
    path.write_text("sharing:\n  timeSlicing:\n    replicas: 4\n    replicas: 1\n")
    with pytest.raises(ConfigError, match=r"line 4, column 5: duplicate key 'replicas' \(first on line 3\)"):
        load_plugin_config(path)


def test_fake_devices_duplicate_key_is_an_error() -> None:
    text = (
        (EXAMPLES / "fake-devices.yaml")
        .read_text()
        .replace("vendor: iluvatar\n", "vendor: iluvatar\nvendor: nvidia\n")
    )
    with pytest.raises(
        ConfigError, match=r"devices\.yaml: not valid YAML: line \d+, column 1: duplicate key 'vendor'"
    ):
        parse_fake_devices(text, "devices.yaml")
    assert parse_fake_devices((EXAMPLES / "fake-devices.yaml").read_bytes(), "ok").vendor == "iluvatar"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("a: 1\nb: 2\na: 3\n", "'a'"),
        ("{a: 1, a: 1}", "'a'"),  # even with the same value
        ("1: a\ntrue: b\n", "True"),  # the same key of the resulting dict
        ("'1': a\nx: {2: a, 2.0: b}\n", "2.0"),
        ("<<: {a: 1}\n<<: {b: 1}\n", "<<"),
        ("key: 1\n? key\n: 2\n", "'key'"),
        ("&k key: 1\n*k : 2\n", "'key'"),
        ("- [{a: 1}, {b: 1, b: 2}]", "'b'"),
    ],
)
def test_duplicate_keys_are_refused_anywhere(text: str, key: str) -> None:
    assert f"duplicate key {key}" in refused(text)


def test_distinct_keys_and_merge_overrides_are_not_duplicates() -> None:
    assert load_yaml("'1': a\n1: b\n", "x") == {"1": "a", 1: "b"}
    data = load_yaml("base: &b {k: 1, j: 2}\nd: {<<: *b, k: 2}\n", "x")
    assert data["d"] == {"k": 2, "j": 2}
    # The merged-from node, reached again after it was merged, is still not a duplicate.
    data = load_yaml("a: &a {x: 1}\nb: &b {<<: *a, x: 2}\nc: {<<: *b, x: 3}\nd: *b\n", "x")
    assert data["c"] == {"x": 3} and data["d"] == {"x": 2}


# --- aliases --------------------------------------------------------------------------------------


def test_alias_bomb_is_refused_in_milliseconds() -> None:
    started = time.perf_counter()
    message = refused(laughs())
    assert time.perf_counter() - started < 1
    assert "refused" in message and "aliases expand to more than 100,000 nodes" in message


def test_alias_budget_counts_the_whole_stream() -> None:
    doc = laughs(levels=3, width=10)  # aliases add 20 + 210 + 2,110 nodes per document
    assert len(load_yaml_documents("---\n".join([doc] * 5), "x", max_alias_nodes=15_000)) == 5
    with pytest.raises(YamlInputError, match="aliases expand"):
        load_yaml_documents("---\n".join([doc] * 20), "x", max_alias_nodes=15_000)


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: [1, {c: *a}]}"])
def test_recursive_aliases_are_refused(text: str) -> None:
    assert "recursive alias" in refused(text)


def test_aliases_become_independent_copies() -> None:
    data = load_yaml("x: &e {k: [1]}\ny: *e\nz: [*e, *e]\n", "x")
    assert data["x"] == data["y"] == data["z"][0] == {"k": [1]}
    ids = {id(data["x"]), id(data["y"]), id(data["z"][0]), id(data["z"][1])}
    assert len(ids) == 4
    assert data["x"]["k"] is not data["y"]["k"]


def test_a_config_may_share_blocks_through_anchors(tmp_path: Path) -> None:
    path = tmp_path / "webhook.yaml"
    path.write_text(
        "apiVersion: ix-gpu.io/v1alpha1\nkind: WebhookConfig\nprofiles:\n"
        "- name: a\n  resources: [nvidia.com/gpu]\n"
        "  env: &env [{name: LD_LIBRARY_PATH, value: /usr/local/cuda/lib64, mode: prepend-path}]\n"
        "- name: b\n  resources: [nvidia.com/mig-*]\n  env: *env\n"
    )
    config = load_config(path)
    assert config.profiles[0].env == config.profiles[1].env


# --- depth ----------------------------------------------------------------------------------------


def nested(levels: int, leaf: str = "") -> str:
    """A document ``levels`` nodes deep: the root mapping, ``levels - 2`` lists, a scalar leaf."""
    inner = levels - 2
    return "a: " + "[" * inner + (leaf or "1") + "]" * inner + "\n"


def test_depth_limit_is_exact() -> None:
    assert load_yaml(nested(100), "x") is not None
    assert "nested deeper than 100 levels" in refused(nested(101))
    assert "line 1, column" in refused(nested(101))


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 10_000 + "]" * 10_000,
        "a:\n" + "".join(" " * i + "- \n" for i in range(0, 600, 2)),
        "[" * 300_000,
    ],
)
def test_deep_nesting_is_refused_not_a_recursion_error(text: str) -> None:
    assert "nested deeper than 100 levels" in refused(text)


def test_depth_counts_through_aliases() -> None:
    text = "x: &x " + "[" * 60 + "]" * 60 + "\ny: " + "[" * 40 + "*x" + "]" * 40 + "\n"
    assert "through an alias" in refused(text)
    data = load_yaml(text, "x", max_depth=200)
    inner = data["y"]
    for _ in range(39):
        inner = inner[0]
    assert inner == [data["x"]]


# --- size -----------------------------------------------------------------------------------------


def test_size_limits() -> None:
    assert load_yaml("a: " + "x" * (yaml_input.CONFIG_MAX_BYTES - 4), "x") is not None
    assert "larger than 1 MiB" in refused("a: " + "x" * yaml_input.CONFIG_MAX_BYTES)
    assert "larger than 1 MiB" in refused(b"a: " + b"x" * yaml_input.CONFIG_MAX_BYTES)
    assert "larger than 100 bytes" in refused("é" * 60, max_bytes=100)  # bytes, not characters
    big = "a: " + "x" * (2 * yaml_input.CONFIG_MAX_BYTES)
    assert load_yaml_documents(big, "manifest")[0]["a"].startswith("xx")  # manifests may be larger


def test_files_are_read_only_up_to_the_limit(tmp_path: Path) -> None:
    with pytest.raises(YamlInputError, match=r"^/dev/zero: refused: larger than 1 MiB$"):
        read_capped("/dev/zero", yaml_input.CONFIG_MAX_BYTES)
    with pytest.raises(YamlInputError, match="cannot read"):
        read_capped(tmp_path, 10)
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"a: " + b"x" * (yaml_input.CONFIG_MAX_BYTES + 10))
    with pytest.raises(ConfigError, match="refused: larger than 1 MiB"):
        load_config(huge)


# --- everything else is one line -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "position 0"),
        (b"\xff\xfe\x00\xd8", "position"),
        ("a: \x00", "position 3"),
        ("a: 2001-99-99", "line 1, column 4: cannot read this timestamp: month must be in 1..12"),
        ("a: !!timestamp x", "cannot read this timestamp"),
        ("a: " + "9" * 5001, "cannot read this int: Exceeds the limit (4300 digits)"),
        ("a: !!int abc", "cannot read this int"),
        ("a: !!float x", "cannot read this float"),
        ("a: !!binary 'a'", "line 1, column 4: "),
        ("a: !!python/object:os.system x", "could not determine a constructor"),
        ("? [1]\n: 2", "unhashable key"),
        ("a: [1\n", "line 2, column 1"),
        ("a: 1\n---\nb: 2\n", "expected a single document"),
        ("a: *nowhere", "found undefined alias"),
        ("a: &x 1\nb: &x 2\n", "duplicate anchor"),
    ],
)
def test_bad_input_is_one_line_naming_the_place(content: bytes | str, reason: str) -> None:
    message = refused(content)
    assert message.startswith("src.yaml: not valid YAML: ")
    assert reason in message


def test_huge_messages_are_cut() -> None:
    message = refused("a: [" + "x" * 10_000 + "\n")
    assert len(message) < 600


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(alphabet="[]{}&*!:-?,'\"#|>@ \n\tab01.eE+%<", max_size=200))
def test_any_input_is_data_or_a_yaml_input_error(content: bytes | str) -> None:
    try:
        load_yaml_documents(content, "fuzz")
    except YamlInputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz: ")


def test_timestamps_can_stay_strings() -> None:
    assert load_yaml("a: 2024-01-01", "x", timestamps=False) == {"a": "2024-01-01"}
    assert load_yaml("a: 2024-01-01", "x") != {"a": "2024-01-01"}  # configs keep YAML 1.1 as it was


def test_documents_and_empty_input() -> None:
    assert load_yaml("", "x") is None
    assert load_yaml("# nothing\n", "x") is None
    assert load_yaml_documents("a: 1\n---\n---\nb: 2\n", "x") == [{"a": 1}, None, {"b": 2}]
    assert load_yaml_documents('{"kind": "Pod", "spec": {"containers": []}}', "x") == [
        {"kind": "Pod", "spec": {"containers": []}}
    ]


def test_parse_yaml_still_validates_after_loading() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_yaml(FakeDevices, "vendor: amd\n", "devices.yaml")
    assert not isinstance(caught.value, YamlInputError)  # readable YAML, invalid content
    assert str(caught.value).startswith("devices.yaml: line 1: vendor")  # every config names the line
