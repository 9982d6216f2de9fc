"""A mixed release on real nodes (issue 54): DRA on one node, the device plugin with its default
``deviceListStrategy: envvar`` on the other, ``webhook.keepImageLibraryPath: auto``.

``gpu-a`` is labelled ``ix-gpu.io/gpu.allocation=device-plugin`` and ``gpu-b`` ``=dra`` before the
install; the chart has ``dra.enabled`` and nothing else of DRA or the device plugin changed. The
device plugin's pods find the driver only through the webhook's ``LD_LIBRARY_PATH`` (plain
Allocate runs no CDI hook), so the release renders it as plain ``prepend-path``. A container
served only through a DRA claim keeps its image's value all the same: the webhook decides per
container, and the claim's CDI spec puts the driver in the container's linker cache.

The library-check image (tests/k8s/images/library-check.c) sets ``ENV LD_LIBRARY_PATH=/opt/imglib``
and has a library of its own there. The tests share the release and run in file order.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.chart_values import real_node_chart_values
from tests.k8s.pods import get_pod, new_namespace, request_ok
from tests.k8s.real_nodes import Images
from tests.k8s.real_release import APP_LIBRARY_PATH, NS_PATH, RESOURCE, Release, open_release
from tests.k8s.test_real_nodes_dra import (
    ALLOCATION_LABEL,
    CDI_LIBRARY,
    IMAGE_LIBRARIES,
    INJECTED,
    RESOURCE_API,
    claim_library_pod,
    claim_template,
    devices,
    image_libraries,
    image_library_pod,
)
from tests.support.paths import ROOT
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(900)

RELEASE = "ixm"
LABELS = {"gpu-a": "device-plugin", "gpu-b": "dra"}
DRIVER_LIB = "/usr/local/corex/lib64"
"""Where the webhook's profile mounts the driver in a container, and the directory its variable names."""


def mixed_values(images: Images) -> dict[str, Any]:
    """The real-node values with ``dra.enabled``: the device plugin's strategy and
    ``keepImageLibraryPath`` stay at their defaults (``envvar``, ``auto``)."""
    values = real_node_chart_values(images)
    values["dra"] = {"enabled": True}
    return values


def pod_of(release: Release, namespace: str, name: str) -> dict[str, Any]:
    pod = get_pod(release.api, namespace, name)
    assert pod is not None, name
    return pod


def allocatable(release: Release, node: str) -> int:
    found = request_ok(release.api, "GET", f"/api/v1/nodes/{node}")["status"]["allocatable"]
    return int(found.get(RESOURCE, "0"))


def install_mixed(release: Release) -> None:
    """Label gpu-a for the device plugin and gpu-b for DRA, install the chart, wait until each
    node's allocator offers its chips (and only that one)."""
    for node, allocator in LABELS.items():
        status, reply = release.api.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"labels": {ALLOCATION_LABEL: allocator}}},
            content_type="application/merge-patch+json",
        )
        assert status == 200, reply
    chart = str(ROOT / "charts" / "ix-gpu")
    result = release.helm(
        "install", RELEASE, chart, "--create-namespace", "-f", str(release.values_file()),
        "--wait", "--timeout", "240s",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    wait_until(
        lambda: bool(devices(release, "gpu-b")) and allocatable(release, "gpu-a") > 0,
        "gpu-b's chips in its ResourceSlice and gpu-a's offered by the device plugin",
        120,
        interval=0.5,
    )
    assert not devices(release, "gpu-a") and allocatable(release, "gpu-b") == 0


@pytest.fixture(scope="module")
def release(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, k8s_log_dir: Path
) -> Iterator[Release]:
    for installed in open_release(request, tmp_path_factory, k8s_log_dir / "real-nodes-mixed", mixed_values):
        install_mixed(installed)
        yield installed


def test_the_release_renders_the_library_path_as_plain_prepend_path(release: Release) -> None:
    """What the per-container rule is for: the release's config as the webhook reads it keeps the
    variable's plain mode (its device plugin pods need it) and leaves the claims' policy at its
    default."""
    config_map = request_ok(release.api, "GET", f"{NS_PATH}/configmaps/{RELEASE}-ix-gpu-webhook")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    modes = [(v["name"], v["mode"]) for p in config["profiles"] for v in p["env"]]
    assert ("LD_LIBRARY_PATH", "prepend-path") in modes, modes
    assert "keepImageLibraryPathInClaims" not in config["policy"], config["policy"]


def test_a_claim_pod_keeps_its_images_library_path_beside_an_envvar_device_plugin(release: Release) -> None:
    """The library-check image in one namespace, once through a claim (gpu-b, DRA) and once with
    ``iluvatar.com/gpu: 1`` (gpu-a, the device plugin's ``envvar``). The claim pod's spec gets no
    ``LD_LIBRARY_PATH``: its image's ``/opt/imglib`` stands, its own library loads through it and
    the driver's through the linker cache. The limit pod's spec gets the profile's variable, which
    replaces the image's: the driver loads from the webhook's mount, the image's library does not
    (the one case the docs name where the image's value is lost)."""
    api = release.api
    image = release.library_check_image
    namespace = f"mixed-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    request_ok(
        api,
        "POST",
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates",
        claim_template("g", None),
    )
    claim = image_libraries(release, ns, image_library_pod("claim", image, "g"))
    limit = image_libraries(release, ns, image_library_pod("limit", image))
    pods = {name: pod_of(release, namespace, name) for name in ("claim", "limit")}
    print(f"\nclaim pod: {json.dumps(claim)}\nlimit pod: {json.dumps(limit)}")

    claim_pod = pods["claim"]
    assert claim_pod["spec"]["nodeName"] == "gpu-b"
    assert claim_pod["metadata"]["annotations"][INJECTED].startswith("iluvatar@"), claim_pod["metadata"]
    main = claim_pod["spec"]["containers"][0]
    assert "env" not in main, main
    assert [m["mountPath"] for m in main["volumeMounts"] if m["name"].startswith("ix-gpu-")] == [
        "/usr/local/corex"
    ]
    assert {k: claim.get(k) for k in IMAGE_LIBRARIES} == IMAGE_LIBRARIES, claim

    limit_pod = pods["limit"]
    assert limit_pod["spec"]["nodeName"] == "gpu-a"
    assert limit_pod["spec"]["containers"][0]["env"] == [{"name": "LD_LIBRARY_PATH", "value": DRIVER_LIB}]
    assert limit["LD_LIBRARY_PATH"] == DRIVER_LIB, limit
    assert limit["driver library"] == f"{DRIVER_LIB}/libixml.so", limit
    assert (
        limit["image library"].startswith("failed")
        and "cannot open shared object file" in limit["image library"]
    )
    request_ok(api, "DELETE", ns)


def test_a_claim_pod_that_sets_its_library_path_gets_the_profiles_merged_in(release: Release) -> None:
    """A claim pod whose spec sets ``LD_LIBRARY_PATH`` gets the profile's directory merged in
    front, once; with or without the variable the driver's library loads."""
    api = release.api
    namespace = f"mixed-lib-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    request_ok(
        api,
        "POST",
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates",
        claim_template("g", None),
    )
    found = image_libraries(release, ns, claim_library_pod("lib", release.image, "g"))
    pod = pod_of(release, namespace, "lib")
    assert pod["spec"]["nodeName"] == "gpu-b"
    assert found["LD_LIBRARY_PATH"] == f"{DRIVER_LIB}:{APP_LIBRARY_PATH}", found
    assert found["ldcache"] == CDI_LIBRARY, found
    assert found["loaded with LD_LIBRARY_PATH"] == f"{DRIVER_LIB}/libixml.so", found
    assert found["loaded without LD_LIBRARY_PATH"] == CDI_LIBRARY, found
    request_ok(api, "DELETE", ns)
