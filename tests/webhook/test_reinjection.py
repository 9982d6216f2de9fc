"""Re-injection after a config change: what an older config injected is taken back, exactly.

The property: for any pod, injecting under config A and then admitting the result under config B
gives what injecting under B alone gives (also after apiserver defaulting in between). So a
template injected last week never keeps last week's driver path, and nothing the user wrote is
touched: if stripping removed a user's item, or kept one of A's, the two sides would differ.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_gpu.devicemodel import labels
from ix_gpu.devicemodel.webhook_config import default_config, parse_config
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.support.objects import container, pod
from tests.webhook.test_properties import RICH, SETTINGS, _apiserver_defaults, namespaces, pods

DEFAULT = CompiledConfig(default_config())


def _moved(config: CompiledConfig, *, driver: str, selector: dict[str, str]) -> CompiledConfig:
    """``config`` after an operator moved the driver and changed the node selector."""
    raw = default_config().model_dump(mode="json", by_alias=True)
    profile = raw["profiles"][0]
    profile["volumes"][0].update(hostPath=driver, mountPath=driver)
    profile["env"][0]["value"] = f"{driver}/lib64"
    profile["nodeSelector"] = selector
    return CompiledConfig(parse_config(raw))


MOVED = _moved(DEFAULT, driver="/opt/corex", selector={"gpu": "iluvatar"})
PAIRS = [(DEFAULT, MOVED), (MOVED, DEFAULT), (RICH, DEFAULT), (DEFAULT, RICH), (RICH, MOVED)]


def admit(obj: dict[str, Any], namespace: NamespaceFacts, config: CompiledConfig) -> dict[str, Any]:
    result = mutate(obj, "CREATE", namespace, config)
    assert result.decision is not Decision.DENIED, result.reason
    patched: dict[str, Any] = jsonpatch.apply_patch(obj, result.ops)
    return patched


def without_records(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    metadata = out.get("metadata", {})
    annotations = metadata.get("annotations", {})
    for key in (labels.INJECTED, labels.INJECTED_ITEMS):
        annotations.pop(key, None)
    if not annotations:
        metadata.pop("annotations", None)
    return out


@SETTINGS
@given(pod=pods(), namespace=namespaces, pair=st.sampled_from(range(len(PAIRS))), defaulted=st.booleans())
def test_a_config_change_reinjects_as_if_only_the_new_config_had_run(
    pod: dict[str, Any], namespace: NamespaceFacts, pair: int, defaulted: bool
) -> None:
    old, new = PAIRS[pair]
    under_old = admit(pod, namespace, old)
    if defaulted:
        under_old = _apiserver_defaults(under_old)
    then_new = admit(under_old, namespace, new)
    only_new = admit(_apiserver_defaults(pod) if defaulted else pod, namespace, new)
    assert without_records(then_new) == without_records(only_new)
    annotations = then_new.get("metadata", {}).get("annotations", {})
    assert annotations.get(labels.INJECTED) == only_new.get("metadata", {}).get("annotations", {}).get(
        labels.INJECTED
    )
    assert mutate(then_new, "CREATE", namespace, new).ops == [], "and a further pass changes nothing"


def test_the_issue_example_a_moved_driver_is_mounted_from_the_new_path() -> None:
    """A TFJob template injected under the old config produces pods whose old volume used to
    'conflict' with the new one, so the new driver was never mounted."""
    team = NamespaceFacts("team")
    old_pod = admit(pod(), team, DEFAULT)
    new_pod = admit(old_pod, team, MOVED)
    (volume,) = new_pod["spec"]["volumes"]
    assert volume["hostPath"]["path"] == "/opt/corex"
    (mount,) = new_pod["spec"]["containers"][0]["volumeMounts"]
    assert mount["mountPath"] == "/opt/corex"
    env = {e["name"]: e["value"] for e in new_pod["spec"]["containers"][0]["env"]}
    assert env["LD_LIBRARY_PATH"] == "/opt/corex/lib64"
    assert new_pod["spec"]["nodeSelector"] == {"gpu": "iluvatar"}
    assert new_pod["metadata"]["annotations"][labels.INJECTED].endswith("@" + MOVED.digest)
    record = json.loads(new_pod["metadata"]["annotations"][labels.INJECTED_ITEMS])
    recorded_volumes = [op["value"] for op in record["ops"] if op["path"] == "/spec/volumes"]
    assert recorded_volumes == [new_pod["spec"]["volumes"]], "the record holds what this config added"


def test_what_the_user_changed_after_injection_is_kept() -> None:
    team = NamespaceFacts("team")
    user = pod(containers=[container("main", 1, env=[{"name": "LD_LIBRARY_PATH", "value": "/mine"}])])
    injected = admit(user, team, DEFAULT)
    main = injected["spec"]["containers"][0]
    assert main["env"][0]["value"] == "/usr/local/corex/lib64:/mine"
    main["env"][0]["value"] = "/edited"  # the user's now
    injected["spec"]["volumes"][0]["hostPath"]["path"] = "/custom"  # likewise
    moved = admit(injected, team, MOVED)
    assert moved["spec"]["volumes"][0]["hostPath"]["path"] == "/custom"
    assert {e["name"]: e["value"] for e in moved["spec"]["containers"][0]["env"]}["LD_LIBRARY_PATH"] == (
        "/opt/corex/lib64:/edited"
    )


@pytest.mark.parametrize(
    "items", ["not json", "[1, 2]", '{"volumes": "x"}', '{"containers": {"x": 1}}', "{" * 5000, "x" * 100_000]
)
def test_a_record_that_is_not_ours_is_ignored_not_a_crash(items: str) -> None:
    obj = pod(annotations={labels.INJECTED: "iluvatar@0000000000", labels.INJECTED_ITEMS: items})
    result = mutate(obj, "CREATE", NamespaceFacts("team"), DEFAULT)
    assert result.decision is Decision.MUTATED
    jsonpatch.apply_patch(obj, result.ops)


def test_without_a_record_an_old_injection_is_left_as_before() -> None:
    """Objects injected before records existed: nothing is removed (nothing is known)."""
    team = NamespaceFacts("team")
    old = admit(pod(), team, DEFAULT)
    del old["metadata"]["annotations"][labels.INJECTED_ITEMS]
    again = mutate(old, "CREATE", team, MOVED)
    assert not any(op["op"] == "remove" for op in again.ops)


def test_replica_keys_and_selector_keys_that_look_like_env_paths_are_not_misread() -> None:
    """A replica key "env" and a nodeSelector key "value" make an op path that contains "/env/" and
    ends in "/value" without being an env value: it once crashed the record (KeyError)."""
    profile = {"name": "i", "resources": ["iluvatar.com/gpu"], "nodeSelector": {"value": "x"}}
    config = CompiledConfig(parse_config({"profiles": [profile]}))
    template = {"spec": {"nodeSelector": {}, "containers": [container("c", 1)]}}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "t"},
        "spec": {"tfReplicaSpecs": {"env": {"template": template}}},
    }
    injected = admit(job, NamespaceFacts("team"), config)
    assert injected["spec"]["tfReplicaSpecs"]["env"]["template"]["spec"]["nodeSelector"] == {"value": "x"}
    moved = admit(injected, NamespaceFacts("team"), DEFAULT)
    assert moved["spec"]["tfReplicaSpecs"]["env"]["template"]["spec"]["nodeSelector"] == {}
