"""The one-pass container merge (``ContainerFast``) decides exactly what the general merge decides.

Every config is compiled twice, once with the fast path and once without it, and each generated
pod (and the pod its patch makes, mutated again under either config) must get the same ops,
warnings, reason and decision from both. The pods collide with what the profiles inject where the
fast path must step aside: a mount at the driver's path, the env name already set (by value or
``valueFrom``), entries that are not maps, names that are not strings, lists that are not lists.
Some containers ask through a DRA claim, alone or beside their limits (the claim containers'
one-pass merge, ``claim_fast``).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ix_gpu.config.webhook_config import WebhookConfig, default_config, load_config, parse_config
from ix_gpu.webhook.core.claims import KnownClaims
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import MutationResult, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.support.objects import claim_template

EXAMPLES = int(os.environ.get("IX_GPU_PROPERTY_EXAMPLES", "2000")) // 4
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SEED_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "seed-config.yaml"


def _compiled(config: WebhookConfig, fast: bool) -> CompiledConfig:
    return CompiledConfig(config, fast_path=fast)


def _if_set(config: WebhookConfig) -> WebhookConfig:
    """``config`` with every path env merged only into a value the container sets."""
    data = config.model_dump(mode="json", by_alias=True)
    for profile in data["profiles"]:
        for var in profile["env"]:
            var["mode"] = var["mode"].replace("path", "path-if-set") if "path" in var["mode"] else var["mode"]
    return parse_config(data, "if-set")


CONFIGS = [default_config(), load_config(SEED_CONFIG), _if_set(default_config())]
CLAIMS = KnownClaims.of([claim_template("gpu")])
"""The claim every generated pod declares: one device of the built-in profile's DeviceClass."""
PAIRS = [(_compiled(c, True), _compiled(c, False)) for c in CONFIGS]


def test_the_default_config_has_fast_profiles_and_the_slow_twins_have_none() -> None:
    assert any(p.fast is not None for p in PAIRS[0][0].profiles)
    # The built-in Iluvatar profile's LD_LIBRARY_PATH is if-set in claim containers: a fast twin.
    iluvatar = PAIRS[0][0].profiles[0]
    assert iluvatar.claim_fast is not None and iluvatar.claim_fast is not iluvatar.fast
    for _, slow in PAIRS:
        assert all(p.fast is None and p.claim_fast is None for p in slow.profiles)


_ENV = st.one_of(
    st.builds(
        lambda n, v: {"name": n, "value": v},
        st.sampled_from(["A", "LD_LIBRARY_PATH", "PATH"]),
        st.text(max_size=8),
    ),
    st.just({"name": "LD_LIBRARY_PATH", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}),
    st.just({"value": "no name"}),
    st.just({"name": ["not", "hashable"]}),
    st.just("not a map"),
)
_MOUNT = st.one_of(
    st.builds(
        lambda n, p: {"name": n, "mountPath": p},
        st.sampled_from(["data", "ix-gpu-iluvatar-driver"]),
        st.sampled_from(["/data", "/usr/local/corex", "/usr/local/nvidia"]),
    ),
    st.just({"name": "data", "mountPath": ["x"]}),
    st.just(7),
)


@st.composite
def _containers(draw: st.DrawFn, prefix: str) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        container: dict[str, Any] = {"name": f"{prefix}{i}", "image": "x"}
        env = draw(st.one_of(st.none(), st.lists(_ENV, max_size=4), st.just({"A": "b"})))
        if env is not None:
            container["env"] = env
        mounts = draw(st.one_of(st.none(), st.lists(_MOUNT, max_size=3), st.just("x")))
        if mounts is not None:
            container["volumeMounts"] = mounts
        limits = draw(
            st.dictionaries(
                st.sampled_from(["iluvatar.com/gpu", "nvidia.com/gpu", "cpu"]), st.sampled_from([1, "1", 0])
            )
        )
        container["resources"] = {"limits": limits}
        if draw(st.booleans()):
            # A DRA claim: with no GPU in the limits, the claim containers' env (claim_fast).
            container["resources"]["claims"] = [{"name": "gpu"}]
        if draw(st.booleans()):
            container["securityContext"] = {"allowPrivilegeEscalation": False}
        out.append(container)
    return out


@st.composite
def _pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": draw(_containers("c"))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(_containers("i"))
    if draw(st.booleans()):
        spec["volumes"] = [{"name": "data", "emptyDir": {}}]
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"}, "spec": spec}


def _same(fast: MutationResult, slow: MutationResult) -> None:
    assert fast.decision == slow.decision
    assert fast.ops == slow.ops
    assert fast.warnings == slow.warnings
    assert fast.reason == slow.reason
    assert fast.profiles == slow.profiles


@pytest.mark.parametrize("pair", range(len(PAIRS)))
@SETTINGS
@given(pod=_pods(), known=st.booleans())
def test_fast_merge_matches_the_general_merge(pair: int, pod: dict[str, Any], known: bool) -> None:
    fast, slow = PAIRS[pair]
    namespace = NamespaceFacts("team") if known else NamespaceFacts.unknown("team")
    first = mutate(copy.deepcopy(pod), "CREATE", namespace, fast, CLAIMS)
    _same(first, mutate(copy.deepcopy(pod), "CREATE", namespace, slow, CLAIMS))
    if not first.ops or not first.allowed:
        return
    patched = jsonpatch.apply_patch(copy.deepcopy(pod), first.ops)
    for other_fast, other_slow in PAIRS:  # again, and under the other config (stale stripping)
        _same(
            mutate(copy.deepcopy(patched), "CREATE", namespace, other_fast, CLAIMS),
            mutate(copy.deepcopy(patched), "CREATE", namespace, other_slow, CLAIMS),
        )
