"""``prepend-path-if-set`` / ``append-path-if-set``: the profile's directory is merged into a value
the container's spec sets, and nothing is added where it sets none, so that the image's own
``ENV LD_LIBRARY_PATH`` (which the webhook cannot see, and which a container ``env`` entry would
replace) stands; the node's linker-cache hook finds the driver there (CDI, DRA)."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest

from ix_gpu.config.webhook_config import default_config, parse_config
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.support.objects import container, pod

DRIVER_LIB = "/usr/local/corex/lib64"
TEAM = NamespaceFacts("team")


def config(mode: str) -> CompiledConfig:
    raw = default_config().model_dump(mode="json", by_alias=True)
    raw["profiles"][0]["env"][0]["mode"] = mode
    return CompiledConfig(parse_config(raw))


def admit(obj: dict[str, Any], compiled: CompiledConfig) -> tuple[dict[str, Any], Any]:
    result = mutate(obj, "CREATE", TEAM, compiled)
    assert result.decision is not Decision.DENIED, result.reason
    patched: dict[str, Any] = jsonpatch.apply_patch(obj, result.ops)
    return patched, result


def env_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in obj["spec"]["containers"][0].get("env", [])
    }


@pytest.mark.parametrize("with_env_list", [False, True], ids=["no env", "other env"])
def test_a_container_that_sets_no_library_path_gets_none_and_keeps_the_images(with_env_list: bool) -> None:
    fields = {"env": [{"name": "A", "value": "1"}]} if with_env_list else {}
    injected, _ = admit(pod(containers=[container("main", 1, **fields)]), config("prepend-path-if-set"))
    assert "LD_LIBRARY_PATH" not in env_of(injected)
    main = injected["spec"]["containers"][0]
    assert [m["mountPath"] for m in main["volumeMounts"]] == ["/usr/local/corex"]  # the driver still is
    assert injected["metadata"]["annotations"][labels.INJECTED].startswith("iluvatar@")
    record = json.loads(injected["metadata"]["annotations"][labels.INJECTED_ITEMS])
    assert "LD_LIBRARY_PATH" not in json.dumps(record)


@pytest.mark.parametrize(
    ("mode", "merged"),
    [("prepend-path-if-set", f"{DRIVER_LIB}:/mine"), ("append-path-if-set", f"/mine:{DRIVER_LIB}")],
)
def test_a_library_path_the_container_sets_is_merged_once(mode: str, merged: str) -> None:
    user = pod(containers=[container("main", 1, env=[{"name": "LD_LIBRARY_PATH", "value": "/mine"}])])
    injected, _ = admit(user, config(mode))
    assert env_of(injected)["LD_LIBRARY_PATH"] == merged
    again, result = admit(injected, config(mode))
    assert again == injected and result.ops == []


def test_a_library_path_from_value_from_is_kept_and_said() -> None:
    source = {"fieldRef": {"fieldPath": "metadata.name"}}
    user = pod(containers=[container("main", 1, env=[{"name": "LD_LIBRARY_PATH", "valueFrom": source}])])
    injected, result = admit(user, config("prepend-path-if-set"))
    assert env_of(injected)["LD_LIBRARY_PATH"] == source
    assert any("valueFrom" in note for note in result.warnings), result.warnings


def test_switching_to_if_set_takes_back_the_variable_the_old_mode_added() -> None:
    """A pod injected under ``prepend-path`` (its template, say) mutated again under the if-set
    mode: the variable the old config added is stripped (the injection record names it) and none
    is added, so the image's value is back."""
    old, _ = admit(pod(containers=[container("main", 1)]), config("prepend-path"))
    assert env_of(old)["LD_LIBRARY_PATH"] == DRIVER_LIB
    new, _ = admit(old, config("prepend-path-if-set"))
    assert "LD_LIBRARY_PATH" not in env_of(new)
