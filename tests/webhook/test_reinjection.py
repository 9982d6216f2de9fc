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
from hypothesis import assume, given
from hypothesis import strategies as st

from ix_gpu.config.webhook_config import default_config, parse_config
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from ix_gpu.webhook.core.record_items import item_ref
from tests.support.objects import container, pod
from tests.webhook.test_properties import (
    CLAIMS,
    LIBRARY_PATH_EVERYWHERE,
    RICH,
    SETTINGS,
    _apiserver_defaults,
    _uses_unknown_claim,
    namespaces,
    pods,
)

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
EVERYWHERE = LIBRARY_PATH_EVERYWHERE
PAIRS = [
    (DEFAULT, MOVED),
    (MOVED, DEFAULT),
    (RICH, DEFAULT),
    (DEFAULT, RICH),
    (RICH, MOVED),
    # keepImageLibraryPathInClaims turned off and on: claim containers gain or lose the variable.
    (DEFAULT, EVERYWHERE),
    (EVERYWHERE, DEFAULT),
    (EVERYWHERE, RICH),
]


def admit(obj: dict[str, Any], namespace: NamespaceFacts, config: CompiledConfig) -> dict[str, Any]:
    result = mutate(obj, "CREATE", namespace, config, CLAIMS)
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
    # A pod using a claim the webhook does not know is refused under every config (claimLookupFailure:
    # deny): no injection to move from one config to the next.
    assume(not _uses_unknown_claim(pod))
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
    assert mutate(then_new, "CREATE", namespace, new, CLAIMS).ops == [], "and a further pass changes nothing"


def test_the_issue_example_a_moved_driver_is_mounted_from_the_new_path() -> None:
    """A TFJob template injected under the old config produces pods whose old volume must not
    'conflict' with the new one: the new driver is mounted from the new path."""
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
    assert record["vol"] == [item_ref(volume["name"], volume)], "the record names what this config added"


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
    ends in "/value" without being an env value: the record must not take it for one (KeyError)."""
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


# Pods as an earlier version injected them, with its record of the whole patch ops (the first
# format of injected-items): under DEFAULT, and under RICH into a user's env entries.
FIRST_FORMAT_DEFAULT: dict[str, Any] = json.loads(
    '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"ix-gpu.io/injected":"iluvatar@91a2b21207","ix-gpu.io/injected-items":"{\\"at\\":\\"\\",\\"ops\\":[{\\"op\\":\\"add\\",\\"path\\":\\"/spec/volumes\\",\\"value\\":[{\\"name\\":\\"ix-gpu-iluvatar-driver\\",\\"hostPath\\":{\\"path\\":\\"/usr/local/corex\\",\\"type\\":\\"Directory\\"}}]},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/containers/0/volumeMounts\\",\\"value\\":[{\\"name\\":\\"ix-gpu-iluvatar-driver\\",\\"mountPath\\":\\"/usr/local/corex\\",\\"readOnly\\":true}]},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/containers/0/env\\",\\"value\\":[{\\"name\\":\\"LD_LIBRARY_PATH\\",\\"value\\":\\"/usr/local/corex/lib64\\"}]},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/tolerations\\",\\"value\\":[{\\"key\\":\\"iluvatar.com/gpu\\",\\"operator\\":\\"Exists\\",\\"effect\\":\\"NoSchedule\\"}]}]}"}},"spec":{"containers":[{"name":"main","image":"corex:4.0.0","resources":{"limits":{"iluvatar.com/gpu":1}},"volumeMounts":[{"name":"ix-gpu-iluvatar-driver","mountPath":"/usr/local/corex","readOnly":true}],"env":[{"name":"LD_LIBRARY_PATH","value":"/usr/local/corex/lib64"}]}],"volumes":[{"name":"ix-gpu-iluvatar-driver","hostPath":{"path":"/usr/local/corex","type":"Directory"}}],"tolerations":[{"key":"iluvatar.com/gpu","operator":"Exists","effect":"NoSchedule"}]}}'
)
FIRST_FORMAT_RICH: dict[str, Any] = json.loads(
    '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"ix-gpu.io/injected":"iluvatar@254dde8c1f","ix-gpu.io/injected-items":"{\\"at\\":\\"\\",\\"ops\\":[{\\"op\\":\\"add\\",\\"path\\":\\"/spec/volumes\\",\\"value\\":[{\\"name\\":\\"ix-driver\\",\\"hostPath\\":{\\"path\\":\\"/usr/local/corex\\",\\"type\\":\\"Directory\\"}},{\\"name\\":\\"ix-itrctl\\",\\"hostPath\\":{\\"path\\":\\"/dev/itrctl\\",\\"type\\":\\"CharDevice\\"}}]},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/containers/0/volumeMounts\\",\\"value\\":[{\\"name\\":\\"ix-driver\\",\\"mountPath\\":\\"/usr/local/corex\\",\\"readOnly\\":true},{\\"name\\":\\"ix-itrctl\\",\\"mountPath\\":\\"/dev/itrctl\\"}]},{\\"op\\":\\"replace\\",\\"path\\":\\"/spec/containers/0/env/0/value\\",\\"value\\":\\"/usr/local/corex/lib64:/mine\\"},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/containers/0/env/1/value\\",\\"value\\":\\"/usr/local/corex/bin\\"},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/containers/0/env/-\\",\\"value\\":{\\"name\\":\\"IX_MODE\\",\\"value\\":\\"train\\"}},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/nodeSelector\\",\\"value\\":{\\"ix-gpu.io/gpu.present\\":\\"true\\"}},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/tolerations\\",\\"value\\":[{\\"key\\":\\"iluvatar.com/gpu\\",\\"operator\\":\\"Exists\\",\\"effect\\":\\"NoSchedule\\"}]},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/affinity\\",\\"value\\":{\\"nodeAffinity\\":{\\"requiredDuringSchedulingIgnoredDuringExecution\\":{\\"nodeSelectorTerms\\":[{\\"matchExpressions\\":[{\\"key\\":\\"ix-gpu.io/gpu.count\\",\\"operator\\":\\"Exists\\"}]}]}}}},{\\"op\\":\\"add\\",\\"path\\":\\"/spec/runtimeClassName\\",\\"value\\":\\"corex\\"}],\\"previous\\":{\\"/spec/containers/0/env/0/value\\":\\"/mine\\",\\"/spec/containers/0/env/1/value\\":null}}"}},"spec":{"containers":[{"name":"main","image":"corex:4.0.0","env":[{"name":"LD_LIBRARY_PATH","value":"/usr/local/corex/lib64:/mine"},{"name":"PATH","value":"/usr/local/corex/bin"},{"name":"IX_MODE","value":"train"}],"resources":{"limits":{"iluvatar.com/gpu":1}},"volumeMounts":[{"name":"ix-driver","mountPath":"/usr/local/corex","readOnly":true},{"name":"ix-itrctl","mountPath":"/dev/itrctl"}]},{"name":"side","image":"corex:4.0.0"}],"volumes":[{"name":"ix-driver","hostPath":{"path":"/usr/local/corex","type":"Directory"}},{"name":"ix-itrctl","hostPath":{"path":"/dev/itrctl","type":"CharDevice"}}],"nodeSelector":{"ix-gpu.io/gpu.present":"true"},"tolerations":[{"key":"iluvatar.com/gpu","operator":"Exists","effect":"NoSchedule"}],"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"ix-gpu.io/gpu.count","operator":"Exists"}]}]}}},"runtimeClassName":"corex"}}'
)


@pytest.mark.parametrize(
    ("injected", "config"),
    [(FIRST_FORMAT_DEFAULT, MOVED), (FIRST_FORMAT_RICH, DEFAULT), (FIRST_FORMAT_RICH, MOVED)],
)
def test_a_record_in_the_first_format_is_stripped_as_exactly(
    injected: dict[str, Any], config: CompiledConfig
) -> None:
    """Upgrading the webhook does not strand what the earlier version injected: its record is read,
    and the pod ends as if only the new config had run on what the user wrote."""
    team = NamespaceFacts("team")
    user = pod(
        containers=[
            container("main", 1, env=[{"name": "LD_LIBRARY_PATH", "value": "/mine"}, {"name": "PATH"}]),
            container("side"),
        ]
    )
    original = user if injected is FIRST_FORMAT_RICH else pod()
    then_new = admit(copy.deepcopy(injected), team, config)
    assert without_records(then_new) == without_records(admit(original, team, config))
    assert mutate(then_new, "CREATE", team, config).ops == []


def test_a_record_of_a_later_format_is_ignored() -> None:
    obj = pod(
        annotations={labels.INJECTED: "iluvatar@0000000000", labels.INJECTED_ITEMS: '{"v":3,"vol":["x@y"]}'}
    )
    result = mutate(obj, "CREATE", NamespaceFacts("team"), DEFAULT)
    assert not any(op["op"] == "remove" for op in result.ops)


def test_the_record_is_small_for_a_ten_container_pod() -> None:
    """Stored with every Pod: the record names items, it does not copy them. The benchmark's pod:
    3 of 10 containers ask for a GPU; each has 13 env vars and 2 mounts."""
    workers = [
        container(
            f"worker-{i}",
            1 if i < 3 else None,
            env=[{"name": f"SETTING_{j}", "value": "v" * 40} for j in range(13)],
            volumeMounts=[
                {"name": "data", "mountPath": f"/data/{i}"},
                {"name": "cache", "mountPath": f"/c/{i}"},
            ],
        )
        for i in range(10)
    ]
    big = pod(containers=workers, annotations={"team": "ml"})
    big["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    result = mutate(big, "CREATE", NamespaceFacts("team"), DEFAULT)
    after = admit(big, NamespaceFacts("team"), DEFAULT)
    items = after["metadata"]["annotations"][labels.INJECTED_ITEMS]
    assert len(items) <= 0.25 * len(json.dumps(result.ops, separators=(",", ":")))
    grown = len(json.dumps(after["metadata"]["annotations"], separators=(",", ":"))) - len('{"team":"ml"}')
    assert grown <= 300
