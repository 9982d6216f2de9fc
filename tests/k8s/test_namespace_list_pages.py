"""The webhook's namespace and claim lists and watches against the real kube-apiserver (the oldest
supported): in pages, each page cut down to what the webhook reads as it is parsed (a namespace's
labels and annotations under the kept prefixes, metadata only; a claim's request names and device
classes). What a restart costs in memory then grows with a page and with what is kept, not with
managedFields or kilobytes of annotations per object."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from ix_gpu.kube.list_watch import ApiListWatch
from ix_gpu.webhook.core.claims import RESOURCE_CLAIM
from ix_gpu.webhook.core.decision import NamespaceFacts
from ix_gpu.webhook.service.claim_cache import CLAIMS_PATH, ClaimEntry, slim_claim
from ix_gpu.webhook.service.namespace_cache import NamespaceListWatch, api_server, namespace_facts
from tests.k8s.k8s_tier import KubeAPI
from tests.k8s.pods import request_ok
from tests.support.objects import DRA_CLASS, device_request, resource_claim

pytestmark = pytest.mark.timeout(120)

BIG = "x" * 20_000  # a last-applied-configuration the size real ones reach


def test_a_paged_metadata_only_list_keeps_only_what_the_webhook_reads(kube_api: KubeAPI) -> None:
    token = secrets.token_hex(3)
    names = [f"pages-{token}-{i}" for i in range(5)]
    for i, name in enumerate(names):
        metadata: dict[str, Any] = {
            "name": name,
            "labels": {"team": "a", "pod-security.kubernetes.io/enforce": "baseline"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": BIG},
        }
        if i == 0:
            metadata["annotations"]["ix-gpu.io/inject"] = "disabled"
        request_ok(kube_api, "POST", "/api/v1/namespaces", {"metadata": metadata})
    api = NamespaceListWatch(api_server(str(kube_api.kubeconfig)), page_size=2)
    try:
        items, version = api.list()
        assert all(isinstance(item, NamespaceFacts) for item in items), "each kept as its facts"
        listed = {item.name: item for item in items}
        assert set(names) <= set(listed)
        assert api.pages >= (len(listed) + 1) // 2, "2 a page: every page was read"
        assert version.isdigit()
        assert listed[names[0]] == NamespaceFacts(
            names[0], {"pod-security.kubernetes.io/enforce": "baseline"}, {"ix-gpu.io/inject": "disabled"}
        ), "no other label, no last-applied-configuration"
        assert namespace_facts(listed[names[0]]) is listed[names[0]]
        # A watch from the list's version, metadata only, sees what comes after the list.
        late = f"pages-{token}-late"
        request_ok(
            kube_api,
            "POST",
            "/api/v1/namespaces",
            {"metadata": {"name": late, "labels": {"ix-gpu.io/x": "1"}}},
        )
        for event in api.watch(version, timeout_seconds=5):
            if event["type"] == "OPENED":  # the list-watch's own first event
                continue
            obj = event["object"]
            if event["type"] == "ADDED" and obj["metadata"]["name"] == late:
                assert obj["kind"] == "PartialObjectMetadata", obj
                assert "spec" not in obj and "status" not in obj
                break
        else:
            raise AssertionError("the watch never showed the namespace created after the list")
        got = api.get(names[1], timeout=5)
        assert got is not None and got["kind"] == "PartialObjectMetadata" and "spec" not in got
    finally:
        api.close()


def test_a_paged_claim_list_keeps_only_request_names_and_device_classes(kube_api: KubeAPI) -> None:
    namespace = f"claims-{secrets.token_hex(3)}"
    request_ok(kube_api, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    for i in range(5):
        claim = resource_claim(f"c{i}", [device_request("gpu"), device_request("spare", "other.example.com")])
        claim["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": BIG}
        request_ok(kube_api, "POST", path, claim)
    api = ApiListWatch(
        api_server(str(kube_api.kubeconfig)),
        CLAIMS_PATH,
        "resourceclaim",
        page_size=2,
        slim=slim_claim(RESOURCE_CLAIM),
    )
    try:
        items, version = api.list()
        assert all(isinstance(item, ClaimEntry) for item in items), "each kept as its entry"
        mine = sorted(item for item in items if item.namespace == namespace)
        assert [item.name for item in mine] == [f"c{i}" for i in range(5)]
        assert api.pages >= (len(items) + 1) // 2, "2 a page: every page was read"
        assert version.isdigit()
        assert mine[0].requests == (("gpu", DRA_CLASS), ("spare", "other.example.com"))
        assert mine[0].requests[0][1] is mine[4].requests[0][1], "device class names are shared"
    finally:
        api.close()
