"""The webhook's namespace list and watch against the real kube-apiserver (the oldest supported):
metadata only (``PartialObjectMetadata``), in pages, each page cut down to the labels and
annotations the webhook reads as it is parsed. What a restart costs in memory then grows with a
page and with what is kept, not with managedFields or kilobytes of annotations per namespace."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from ix_gpu.webhook.core.decision import NamespaceFacts
from ix_gpu.webhook.service.namespace_cache import KubernetesNamespaceApi, api_client, namespace_facts
from tests.k8s.k8s_tier import KubeAPI
from tests.k8s.pods import request_ok

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
    api = KubernetesNamespaceApi(api_client(str(kube_api.kubeconfig)), page_size=2)
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
