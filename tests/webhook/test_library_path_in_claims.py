"""Per container, not per release: a container that gets its GPUs only through DRA claims keeps its
image's ``LD_LIBRARY_PATH`` whatever the device plugin does elsewhere.

A release with DRA on some nodes and the device plugin's ``envvar`` strategy on others renders the
profile's ``LD_LIBRARY_PATH`` as plain ``prepend-path`` (``webhook.keepImageLibraryPath: auto``),
which the device plugin's pods need: nothing else finds the driver there. A claim's CDI spec puts
the driver in the container's linker cache, so in a container served only through claims the
webhook merges the profile's directory into a value the container's spec sets and adds none
where it sets none (``policy.keepImageLibraryPathInClaims``, true by default)."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest
import yaml

from ix_gpu.config.webhook_config import default_config, parse_config
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.claims import KnownClaims
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, MutationResult, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.chart.rendering import find, render
from tests.support.objects import claim_template, container, pod, pod_claim

DRIVER_LIB = "/usr/local/corex/lib64"
TEAM = NamespaceFacts("team")
CLAIMS = KnownClaims.of([claim_template("gpu")])
MINE = [{"name": "LD_LIBRARY_PATH", "value": "/mine"}]


def release_config(values: dict[str, Any]) -> CompiledConfig:
    """The webhook's config as the chart renders it for ``values``."""
    objects = render(values)
    config_map = find(objects, "ConfigMap", "ixg-ix-gpu-webhook")
    return CompiledConfig(parse_config(yaml.safe_load(config_map["data"]["config.yaml"]), "rendered"))


MIXED = release_config({"dra": {"enabled": True}})
"""DRA on the nodes labelled for it, the device plugin's default ``envvar`` on the others."""
EVERYWHERE = release_config({"dra": {"enabled": True}, "webhook": {"keepImageLibraryPath": False}})


def admit(obj: dict[str, Any], config: CompiledConfig = MIXED) -> tuple[dict[str, Any], MutationResult]:
    result = mutate(obj, "CREATE", TEAM, config, CLAIMS)
    assert result.decision is Decision.MUTATED, result.reason
    patched: dict[str, Any] = jsonpatch.apply_patch(obj, result.ops)
    return patched, result


def claim_pod(**fields: Any) -> dict[str, Any]:
    return pod(containers=[container("main", claims=["gpu"], **fields)], resource_claims=[pod_claim("gpu")])


def library_path(body: dict[str, Any]) -> str | None:
    found = [e.get("value") for e in body.get("env", []) if e.get("name") == "LD_LIBRARY_PATH"]
    return found[0] if found else None


def test_the_mixed_release_renders_plain_prepend_path() -> None:
    """What the per-container rule is for: the release config keeps the variable's plain mode."""
    (iluvatar, *_) = MIXED.profiles
    assert [(e.name, e.mode) for e in iluvatar.env] == [("LD_LIBRARY_PATH", "prepend-path")]


def test_a_claim_pod_that_sets_no_library_path_gets_none() -> None:
    injected, _ = admit(claim_pod())
    main = injected["spec"]["containers"][0]
    assert "env" not in main, main
    assert [m["mountPath"] for m in main["volumeMounts"]] == ["/usr/local/corex"]  # the driver still is
    assert injected["metadata"]["annotations"][labels.INJECTED] == f"iluvatar@{MIXED.digest}"
    assert "LD_LIBRARY_PATH" not in injected["metadata"]["annotations"][labels.INJECTED_ITEMS]


def test_a_limit_pod_under_the_same_release_still_gets_it() -> None:
    injected, _ = admit(pod(containers=[container("main", 1)]))
    assert library_path(injected["spec"]["containers"][0]) == DRIVER_LIB


@pytest.mark.parametrize("config", [MIXED, EVERYWHERE], ids=["mixed", "everywhere"])
def test_a_claim_pod_that_sets_it_gets_it_merged_once(config: CompiledConfig) -> None:
    injected, _ = admit(claim_pod(env=MINE), config)
    assert library_path(injected["spec"]["containers"][0]) == f"{DRIVER_LIB}:/mine"
    again = mutate(injected, "CREATE", TEAM, config, CLAIMS)
    assert again.ops == [] and again.decision is Decision.UNCHANGED


def test_per_container_in_one_pod() -> None:
    """A claim container, a limit container and a container asking both ways, side by side, and a
    claim init container: only the ones served through claims alone keep the image's value. One
    asking both ways may be served by the ``envvar`` device plugin, which needs the variable."""
    obj = pod(
        containers=[
            container("claim", claims=["gpu"]),
            container("limit", 1),
            container("both", 1, claims=["gpu"]),
            container("zero", 0, claims=["gpu"]),  # a limit of 0 asks for no GPU there
        ],
        init_containers=[container("warm", claims=["gpu"])],
        resource_claims=[pod_claim("gpu")],
    )
    injected, _ = admit(obj)
    spec = injected["spec"]
    found = {c["name"]: library_path(c) for c in spec["containers"] + spec["initContainers"]}
    assert found == {"claim": None, "limit": DRIVER_LIB, "both": DRIVER_LIB, "zero": None, "warm": None}
    assert mutate(injected, "CREATE", TEAM, MIXED, CLAIMS).ops == []


def test_keep_image_library_path_false_sets_it_in_claim_containers_too() -> None:
    injected, _ = admit(claim_pod(), EVERYWHERE)
    assert library_path(injected["spec"]["containers"][0]) == DRIVER_LIB


@pytest.mark.parametrize(("old", "new"), [(EVERYWHERE, MIXED), (MIXED, EVERYWHERE)], ids=["on", "off"])
def test_turning_the_policy_reinjects_as_if_only_the_new_config_had_run(
    old: CompiledConfig, new: CompiledConfig
) -> None:
    """A template injected under one config and its pod admitted under the other: the variable an
    older pass added is taken back (its injection record names it), or added now."""
    for user in (claim_pod(), claim_pod(env=MINE)):
        then_new, _ = admit(admit(user, old)[0], new)
        only_new, _ = admit(user, new)
        assert then_new["spec"] == only_new["spec"]


def test_only_the_library_path_of_a_path_mode_changes_in_claim_containers() -> None:
    """``append-path`` becomes ``append-path-if-set``; other variables, and ``LD_LIBRARY_PATH`` of
    ``override`` or ``set-if-absent``, are as the profile says."""
    raw = default_config().model_dump(mode="json", by_alias=True)
    raw["profiles"][0]["env"] = [
        {"name": "LD_LIBRARY_PATH", "value": DRIVER_LIB, "mode": "append-path"},
        {"name": "PATH", "value": "/usr/local/corex/bin", "mode": "prepend-path"},
        {"name": "IX_MODE", "value": "train", "mode": "override"},
    ]
    config = CompiledConfig(parse_config(raw))
    injected, _ = admit(claim_pod(), config)
    assert injected["spec"]["containers"][0]["env"] == [
        {"name": "PATH", "value": "/usr/local/corex/bin"},
        {"name": "IX_MODE", "value": "train"},
    ]
    merged, _ = admit(claim_pod(env=MINE), config)
    assert library_path(merged["spec"]["containers"][0]) == f"/mine:{DRIVER_LIB}"
    for mode in ("override", "set-if-absent"):
        raw["profiles"][0]["env"] = [{"name": "LD_LIBRARY_PATH", "value": DRIVER_LIB, "mode": mode}]
        injected, _ = admit(claim_pod(), CompiledConfig(parse_config(raw)))
        assert library_path(injected["spec"]["containers"][0]) == DRIVER_LIB, mode


def test_the_policy_left_at_its_default_keeps_every_configs_digest() -> None:
    """Written only when false, so a release that never names it keeps the digest its pods and
    templates carry (no re-injection on upgrade)."""
    assert "keepImageLibraryPathInClaims" not in json.dumps(default_config().model_dump(by_alias=True))
    named = parse_config({"policy": {"keepImageLibraryPathInClaims": True}})
    assert named.digest() == default_config().digest()
    assert EVERYWHERE.digest != MIXED.digest
