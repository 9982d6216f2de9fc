"""The real ``ix-gpu webhook`` process behind a real kube-apiserver (v1.35): the apiserver decides
whether our patches, TLS, caBundle, namespaceSelector, CEL matchConditions, failurePolicy,
reinvocation and dry-run work — the stored objects are the evidence.

The suite's MutatingWebhookConfigurations select only namespaces carrying this module's labels, so
other tests sharing the session apiserver are never sent to these webhooks. Pods stay Pending: there
is no scheduler.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.crds import install_crd, kubeflow_tfjob_crd
from tests.k8s.extra_container_webhook import SIDECAR_NAME, ExtraContainerWebhook
from tests.k8s.k8s_tier import Etcd, K8sBinaries, KubeAPI, start_kube_apiserver
from tests.k8s.webhook_fixtures import (
    INJECT,
    INJECTED,
    PSA_ENFORCE,
    SCOPE_LABEL,
    SUITE_LABEL,
    ApiResponse,
    api,
    must,
    mutating_webhook_configuration,
    webhook_config,
    write_config,
)
from tests.support import objects
from tests.support.cli import ix_gpu
from tests.support.objects import pod, review
from tests.support.waiting import wait_until
from tests.support.webhook_process import WebhookProcess, generate_certs

pytestmark = pytest.mark.k8s

HERE = Path(__file__).resolve().parent
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
ILUVATAR_DRIVER = "ix-gpu-iluvatar-driver"
LD_LIBRARY_PATH = "/usr/local/corex/lib64"


# --------------------------------------------------------------------------- objects


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def create_pod(kube: KubeAPI, namespace: str, body: dict[str, Any], dry_run: bool = False) -> ApiResponse:
    return api(kube, "POST", pods_path(namespace), body, {"dryRun": "All"} if dry_run else None)


def get_pod(kube: KubeAPI, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = must(api(kube, "GET", f"{pods_path(namespace)}/{name}"))
    return result


def names(items: list[dict[str, Any]] | None) -> list[str]:
    return [item["name"] for item in items or []]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    env = container.get("env") or []
    assert len(names(env)) == len(set(names(env))), f"duplicate env in {container['name']}: {env}"
    return {e["name"]: e.get("value", "") for e in env}


def host_path_volumes(spec: dict[str, Any]) -> list[str]:
    return [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]


def assert_iluvatar_injected(spec: dict[str, Any], container: dict[str, Any]) -> None:
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    assert volumes[ILUVATAR_DRIVER]["hostPath"] == {"path": "/usr/local/corex", "type": "Directory"}
    mounts = [m for m in container.get("volumeMounts") or [] if m["name"] == ILUVATAR_DRIVER]
    assert mounts == [{"name": ILUVATAR_DRIVER, "mountPath": "/usr/local/corex", "readOnly": True}], container
    assert env_of(container)["LD_LIBRARY_PATH"] == LD_LIBRARY_PATH
    tolerations = spec.get("tolerations") or []
    assert {"key": "iluvatar.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def assert_untouched(stored: dict[str, Any]) -> None:
    assert INJECTED not in (stored["metadata"].get("annotations") or {}), stored["metadata"]
    spec = stored["spec"]
    assert host_path_volumes(spec) == [], spec.get("volumes")
    for container in spec["containers"]:
        assert "LD_LIBRARY_PATH" not in env_of(container)
    keys = [t.get("key") for t in spec.get("tolerations") or []]
    assert "iluvatar.com/gpu" not in keys and "nvidia.com/gpu" not in keys


# --------------------------------------------------------------------------- fixtures


class Suite:
    """What the module's fixtures set up: the main webhook, its registration and namespace names."""

    def __init__(self, kube: KubeAPI, work: Path, log_dir: Path) -> None:
        self.kube = kube
        self.token = secrets.token_hex(3)
        self.work = work
        self.log_dir = log_dir
        # Namespaces on policy.privilegedNamespaces (created by the tests that use them).
        self.privileged_open = f"e2e-priv-{self.token}"
        self.privileged_psa = f"e2e-priv-psa-{self.token}"
        self.privileged_tf = f"e2e-priv-tf-{self.token}"
        self.config = write_config(
            work / "webhook.yaml",
            webhook_config([self.privileged_open, self.privileged_psa, self.privileged_tf]),
        )
        self.certs = generate_certs(work / "certs")
        self.mwcs: list[str] = []
        self.webhooks: list[WebhookProcess] = []
        self.main: WebhookProcess | None = None

    def scope(self, name: str = "main") -> dict[str, str]:
        return {SUITE_LABEL: self.token, SCOPE_LABEL: f"{name}-{self.token}"}

    def webhook(self, name: str, kubeconfig: Path | None = None, wait_ready: bool = True) -> WebhookProcess:
        server = self.webhook_process(name, kubeconfig or self.kube.kubeconfig)
        return server.start(ready=wait_ready)

    def webhook_process(self, name: str, kubeconfig: Path) -> WebhookProcess:
        """The real ``ix-gpu webhook`` with the suite's config and certificates, logging into the
        tier's log directory; stopped by ``close()``."""
        server = WebhookProcess(
            self.log_dir, self.certs, name=f"ix-gpu-webhook-{name}", config=self.config, kubeconfig=kubeconfig
        )
        self.webhooks.append(server)
        return server

    def register(self, body: dict[str, Any]) -> str:
        must(api(self.kube, "POST", MWC_PATH, body))
        self.mwcs.append(body["metadata"]["name"])
        return str(body["metadata"]["name"])

    def unregister(self, name: str) -> None:
        api(self.kube, "DELETE", f"{MWC_PATH}/{name}")
        if name in self.mwcs:
            self.mwcs.remove(name)

    def namespace(
        self,
        name: str | None = None,
        scope: str = "main",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> str:
        name = name or f"e2e-{scope}-{secrets.token_hex(4)}"
        metadata: dict[str, Any] = {"name": name, "labels": {**self.scope(scope), **(labels or {})}}
        if annotations:
            metadata["annotations"] = annotations
        must(
            api(
                self.kube,
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata},
            )
        )
        return name

    def wait_registered(self, namespace: str, injected: bool = True, timeout_s: float = 30) -> None:
        """The apiserver picks up a new MutatingWebhookConfiguration asynchronously: dry-run a GPU Pod
        until it comes back injected (or, ``injected=False``, admitted at all)."""

        def effective() -> bool:
            resp = create_pod(self.kube, namespace, pod(f"probe-{secrets.token_hex(3)}"), dry_run=True)
            annotations = resp.body.get("metadata", {}).get("annotations") or {} if resp.ok() else {}
            return resp.ok() and (INJECTED in annotations) == injected

        wait_until(effective, f"webhook registration effective in {namespace}", timeout_s, interval=0.2)

    def close(self) -> None:
        for name in list(self.mwcs):
            self.unregister(name)
        for server in self.webhooks:
            server.stop()


@pytest.fixture(scope="module")
def suite(kube_api: KubeAPI, tmp_path_factory: pytest.TempPathFactory, k8s_log_dir: Path) -> Iterator[Suite]:
    s = Suite(kube_api, tmp_path_factory.mktemp("webhook-e2e"), k8s_log_dir)
    try:
        main = s.main = s.webhook("main")
        s.register(
            mutating_webhook_configuration(
                f"e2e-ix-gpu-main-{s.token}", main.mutate_url, main.ca_bundle, s.scope()
            )
        )
        s.wait_registered(s.namespace(scope="main"))
        yield s
    finally:
        s.close()


@pytest.fixture
def main(suite: Suite) -> WebhookProcess:
    server = suite.main
    assert server is not None and server.process is not None and server.process.alive(), (
        "the main webhook process died"
    )
    return server


# --------------------------------------------------------------------------- pods


def test_gpu_pod_is_stored_injected(kube_api: KubeAPI, suite: Suite, main: WebhookProcess) -> None:
    ns = suite.namespace()
    body = pod("gpu", annotations={"ix-gpu.io/gpu-type": "BI-V150"})
    resp = create_pod(kube_api, ns, body)
    assert resp.status == 201, resp.body
    stored = get_pod(kube_api, ns, "gpu")
    assert stored["metadata"]["annotations"][INJECTED].startswith("iluvatar@")
    spec = stored["spec"]
    assert_iluvatar_injected(spec, spec["containers"][0])
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "ix-gpu.io/gpu.product", "operator": "In", "values": ["BI-V150"]} in [
        e for t in terms for e in t.get("matchExpressions", [])
    ], terms
    # Not a privileged namespace: no securityContext.privileged was added.
    assert "privileged" not in (spec["containers"][0].get("securityContext") or {})
    # The apiserver's own defaulting survived the patch (requests defaulted from limits).
    assert spec["containers"][0]["resources"]["requests"] == {"iluvatar.com/gpu": "1"}


def test_non_gpu_pod_is_untouched_and_not_even_sent(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess
) -> None:
    ns = suite.namespace()
    before = main.admissions()
    plain = pod("plain", [objects.container()])
    must(create_pod(kube_api, ns, plain))
    cpu_only = pod("cpu", limits={"cpu": "1"})
    must(create_pod(kube_api, ns, cpu_only))
    assert_untouched(get_pod(kube_api, ns, "plain"))
    assert_untouched(get_pod(kube_api, ns, "cpu"))
    # The CEL matchConditions kept them from the webhook altogether.
    assert main.admissions() == before


def test_match_conditions_select_gpu_init_containers_and_nvidia(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess
) -> None:
    ns = suite.namespace()
    before = main.admissions(kind="Pod")
    must(
        create_pod(
            kube_api,
            ns,
            pod("init-gpu", [objects.container()], init_containers=[objects.container("warmup", 1)]),
        )
    )
    stored = get_pod(kube_api, ns, "init-gpu")
    assert_iluvatar_injected(stored["spec"], stored["spec"]["initContainers"][0])
    # The main container asked for nothing: it gets no mounts or env.
    assert not stored["spec"]["containers"][0].get("volumeMounts")
    must(create_pod(kube_api, ns, pod("nv", limits={"nvidia.com/gpu": "1"})))
    stored = get_pod(kube_api, ns, "nv")
    assert stored["metadata"]["annotations"][INJECTED].startswith("nvidia@")
    container = stored["spec"]["containers"][0]
    assert env_of(container)["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert {"ix-gpu-nvidia-driver", "ix-gpu-dev-nvidia0", "ix-gpu-dev-nvidiactl"} <= set(
        host_path_volumes(stored["spec"])
    )
    assert main.admissions(kind="Pod") == before + 2


# --------------------------------------------------------------------------- TFJob


def seed_tfjob(name: str) -> dict[str, Any]:
    """examples/seed-tfjob.yaml in its kubeflow.org/v1 form, plus a CPU-only PS replica."""

    def template(resources: dict[str, Any] | None) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "tensorflow",
            "image": "gcr.io/project/tf_smoke_cmle-375-20:latest",
        }
        container["args"] = ["--gpu"] if resources else []
        if resources:
            container["resources"] = resources
        return {"metadata": {}, "spec": {"containers": [container], "restartPolicy": "OnFailure"}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None"},
            "tfReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": template({"limits": {"nvidia.com/gpu": 1}}),
                },
                "ps": {"replicas": 2, "restartPolicy": "OnFailure", "template": template(None)},
            },
        },
    }


@pytest.fixture(scope="module")
def tfjob_crd(kube_api: KubeAPI) -> str:
    return install_crd(kube_api, kubeflow_tfjob_crd())


def test_tfjob_gpu_replica_templates_only(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess, tfjob_crd: str
) -> None:
    ns = suite.namespace(suite.privileged_tf)
    job = seed_tfjob("tf-smoke-gpu")
    must(api(kube_api, "POST", f"{tfjob_crd}/namespaces/{ns}/tfjobs", job))
    stored = must(api(kube_api, "GET", f"{tfjob_crd}/namespaces/{ns}/tfjobs/tf-smoke-gpu"))
    replicas = stored["spec"]["tfReplicaSpecs"]
    # What was applied is recorded on the template it was applied to (Pods made from it carry it).
    assert replicas["Master"]["template"]["metadata"]["annotations"][INJECTED].startswith("nvidia@")
    assert INJECTED not in (stored["metadata"].get("annotations") or {})
    # The CPU-only replica is byte-for-byte what we sent.
    assert replicas["ps"] == job["spec"]["tfReplicaSpecs"]["ps"]
    master = replicas["Master"]["template"]["spec"]
    container = master["containers"][0]
    # The seed's hand-written TfJob: /dev/nvidia* by hostPath, CUDA libraries, privileged.
    dev_volumes = {
        v["name"]: v["hostPath"]["path"] for v in master["volumes"] if v["name"].startswith("ix-gpu-dev-")
    }
    assert dev_volumes["ix-gpu-dev-nvidia0"] == "/dev/nvidia0"
    assert dev_volumes["ix-gpu-dev-nvidiactl"] == "/dev/nvidiactl"
    assert dev_volumes["ix-gpu-dev-nvidia-uvm"] == "/dev/nvidia-uvm"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/usr/local/cuda"} <= mounts
    assert env_of(container)["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert container["securityContext"]["privileged"] is True
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in master["tolerations"]
    # A TFJob without GPUs is not sent to the webhook (matchConditions) and is stored as written.
    before = main.admissions()
    cpu_job = seed_tfjob("tf-cpu")
    cpu_job["spec"]["tfReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0].pop("resources")
    must(api(kube_api, "POST", f"{tfjob_crd}/namespaces/{ns}/tfjobs", cpu_job))
    stored_cpu = must(api(kube_api, "GET", f"{tfjob_crd}/namespaces/{ns}/tfjobs/tf-cpu"))
    assert stored_cpu["spec"] == cpu_job["spec"]
    assert main.admissions() == before


# --------------------------------------------------------------------------- opt-out


def test_opt_out_by_namespace_annotation_created_just_before(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess
) -> None:
    skipped_before = main.admissions(kind="Pod", result="skipped")
    lookups_before = main.metric("ix_gpu_namespace_lookups_total")
    ns = suite.namespace(annotations={INJECT: "disabled"})
    must(create_pod(kube_api, ns, pod("gpu")))
    assert_untouched(get_pod(kube_api, ns, "gpu"))
    # The webhook was asked (the annotation is invisible to namespaceSelector and CEL) and skipped,
    # after learning the namespace from its watch or, on a cache miss, a direct GET. Against the real
    # apiserver the watch event has so far always arrived before the Pod's admission (a cache hit);
    # test_cache_miss_path_with_a_get_only_identity covers the miss path deterministically.
    assert main.admissions(kind="Pod", result="skipped") == skipped_before + 1
    assert main.metric("ix_gpu_namespace_lookups_total") > lookups_before


def test_opt_out_by_namespace_label_never_calls_the_webhook(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess
) -> None:
    before = main.admissions()
    ns = suite.namespace(labels={INJECT: "disabled"})
    must(create_pod(kube_api, ns, pod("gpu")))
    assert_untouched(get_pod(kube_api, ns, "gpu"))
    assert main.admissions() == before  # excluded by the namespaceSelector


def test_opt_out_by_pod_annotation(kube_api: KubeAPI, suite: Suite, main: WebhookProcess) -> None:
    ns = suite.namespace()
    before = main.admissions(kind="Pod", result="skipped")
    must(create_pod(kube_api, ns, pod("gpu", annotations={INJECT: "disabled"})))
    assert_untouched(get_pod(kube_api, ns, "gpu"))
    assert main.admissions(kind="Pod", result="skipped") == before + 1


def test_cache_miss_path_with_a_get_only_identity(kube_api: KubeAPI, suite: Suite, tmp_path: Path) -> None:
    """A webhook whose identity may GET namespaces but not list/watch them never fills its cache:
    every namespace answer comes from the direct-GET path, deterministically."""
    sa_ns = suite.namespace(scope="rbac")
    must(
        api(kube_api, "POST", f"/api/v1/namespaces/{sa_ns}/serviceaccounts", {"metadata": {"name": "getter"}})
    )
    role = f"e2e-ns-getter-{suite.token}"
    must(api(kube_api, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "metadata": {"name": role},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}],
    }))  # fmt: skip
    must(api(kube_api, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "getter", "namespace": sa_ns}],
    }))  # fmt: skip
    token = must(api(kube_api, "POST", f"/api/v1/namespaces/{sa_ns}/serviceaccounts/getter/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600},
    }))["status"]["token"]  # fmt: skip
    kubeconfig = yaml.safe_load(kube_api.kubeconfig.read_text())
    kubeconfig["users"][0]["user"]["token"] = token
    path = tmp_path / "getter.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))

    # Never ready (its list is forbidden), but serving.
    server = suite.webhook("getter", path, wait_ready=False)
    assert server.get("/readyz")[0] == 503
    suite.register(
        mutating_webhook_configuration(
            f"e2e-ix-gpu-getter-{suite.token}", server.mutate_url, server.ca_bundle, suite.scope("getter")
        )
    )
    suite.wait_registered(suite.namespace(scope="getter"))
    fetched = server.metric("ix_gpu_namespace_lookups_total", result="fetched")
    opted = suite.namespace(scope="getter", annotations={INJECT: "disabled"})
    must(create_pod(kube_api, opted, pod("gpu")))
    assert_untouched(get_pod(kube_api, opted, "gpu"))
    psa = suite.namespace(scope="getter", labels={PSA_ENFORCE: "baseline"})
    resp = create_pod(kube_api, psa, pod("gpu"))
    assert resp.status == 201, resp.body
    assert host_path_volumes(get_pod(kube_api, psa, "gpu")["spec"]) == []
    assert server.metric("ix_gpu_namespace_lookups_total", result="fetched") == fetched + 2
    assert server.metric("ix_gpu_namespace_lookups_total", result="failed") == 0


# --------------------------------------------------------------------------- dry run


def test_server_side_dry_run_returns_mutation_and_stores_nothing(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess
) -> None:
    ns = suite.namespace()
    before = main.admissions(kind="Pod", result="mutated")
    resp = create_pod(kube_api, ns, pod("dry"), dry_run=True)
    assert resp.status == 201, resp.body
    assert resp.body["metadata"]["annotations"][INJECTED].startswith("iluvatar@")
    assert_iluvatar_injected(resp.body["spec"], resp.body["spec"]["containers"][0])
    assert api(kube_api, "GET", f"{pods_path(ns)}/dry").status == 404
    assert must(api(kube_api, "GET", pods_path(ns)))["items"] == []
    assert main.admissions(kind="Pod", result="mutated") == before + 1


def test_check_injection_command_against_the_real_apiserver(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess
) -> None:
    """``ix-gpu check-injection`` (what the chart's ``helm test`` runs): exit 0 and the annotation
    where the webhook injects, exit 1 and a reason where it does not; nothing is stored."""
    ns = suite.namespace()
    before = main.admissions(kind="Pod", result="mutated")
    result = ix_gpu("check-injection", f"--kubeconfig={kube_api.kubeconfig}", f"--namespace={ns}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"injected: {INJECTED}=iluvatar@"), result.stdout
    assert main.admissions(kind="Pod", result="mutated") == before + 1
    assert must(api(kube_api, "GET", pods_path(ns)))["items"] == []

    opted_out = suite.namespace(labels={INJECT: "disabled"})
    result = ix_gpu("check-injection", f"--kubeconfig={kube_api.kubeconfig}", f"--namespace={opted_out}")
    assert result.returncode == 1
    assert "did not mutate it" in result.stdout, result.stdout

    result = ix_gpu("check-injection", f"--kubeconfig={kube_api.kubeconfig}", "--namespace=no-such-ns")
    assert result.returncode == 1
    assert "HTTP 404" in result.stdout, result.stdout


# --------------------------------------------------------------------------- reinvocation


def test_reinvocation_after_another_webhook_adds_a_gpu_container(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess, tmp_path: Path
) -> None:
    certs = generate_certs(tmp_path / "extra-certs")
    extra = ExtraContainerWebhook(certs / "tls.crt", certs / "tls.key").start()
    try:
        extra_label = {"e2e.ix-gpu.io/extra": suite.token}
        ns = suite.namespace(labels=extra_label)
        # Registered after ours by name ("e2e-z…" sorts after "e2e-ix-gpu…"), so it runs second.
        body = mutating_webhook_configuration(
            f"e2e-z-extra-{suite.token}", extra.url, (certs / "ca.crt").read_bytes(), extra_label,
            match_conditions=False, reinvocation="Never", tfjobs=False,
        )  # fmt: skip
        name = suite.register(body)

        def sidecar_added() -> bool:
            resp = create_pod(kube_api, ns, pod(f"probe-{secrets.token_hex(3)}"), dry_run=True)
            return resp.ok() and SIDECAR_NAME in names(resp.body["spec"]["containers"])

        wait_until(sidecar_added, "extra webhook effective", 30, interval=0.2)
        pod_calls = main.admissions(kind="Pod")
        must(create_pod(kube_api, ns, pod("reinvoked")))
        stored = get_pod(kube_api, ns, "reinvoked")
        spec = stored["spec"]
        assert names(spec["containers"]) == ["main", SIDECAR_NAME]
        # Ours ran first: the extra webhook was sent an object that was already injected.
        seen = [o for o in extra.seen if o["metadata"].get("name") == "reinvoked"]
        assert seen and INJECTED in (seen[0]["metadata"].get("annotations") or {}), seen
        # ...and again after the sidecar appeared (reinvocationPolicy IfNeeded).
        assert main.admissions(kind="Pod") == pod_calls + 2
        assert len(names(spec["volumes"])) == len(set(names(spec["volumes"]))), spec["volumes"]
        assert names(spec["volumes"]).count(ILUVATAR_DRIVER) == 1
        for container in spec["containers"]:
            assert_iluvatar_injected(spec, container)  # the sidecar too; no duplicate mounts or env
            assert len(container.get("env") or []) == 1, container
        suite.unregister(name)
    finally:
        extra.stop()


# --------------------------------------------------------------------------- failure policy


def test_failure_policy_with_the_webhook_stopped(kube_api: KubeAPI, suite: Suite) -> None:
    server = suite.webhook("failure")
    name = suite.register(
        mutating_webhook_configuration(
            f"e2e-ix-gpu-failure-{suite.token}", server.mutate_url, server.ca_bundle, suite.scope("failure"),
            failure_policy="Fail",
        )
    )  # fmt: skip
    ns = suite.namespace(scope="failure")
    suite.wait_registered(ns)
    server.stop()

    refused = create_pod(kube_api, ns, pod("gpu-fail"))
    assert refused.status >= 400, refused.body
    message = refused.body["message"]
    assert 'failed calling webhook "gpu.ix-gpu.io"' in message, message
    assert api(kube_api, "GET", f"{pods_path(ns)}/gpu-fail").status == 404
    # matchConditions: objects without GPU requests never depend on the webhook being up.
    assert create_pod(kube_api, ns, pod("plain-fail", [objects.container()])).status == 201

    must(
        api(
            kube_api, "PATCH", f"{MWC_PATH}/{name}",
            [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}],
            content_type="application/json-patch+json",
        )
    )  # fmt: skip
    suite.wait_registered(ns, injected=False)
    admitted = create_pod(kube_api, ns, pod("gpu-ignore"))
    assert admitted.status == 201, admitted.body
    assert_untouched(get_pod(kube_api, ns, "gpu-ignore"))
    assert create_pod(kube_api, ns, pod("plain-ignore", [objects.container()])).status == 201
    suite.unregister(name)


# --------------------------------------------------------------------------- Pod Security


def test_privileged_profile_in_a_baseline_namespace(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess
) -> None:
    ns = suite.namespace(suite.privileged_psa, labels={PSA_ENFORCE: "baseline"})
    # The real PSA admission enforces baseline here: an explicitly privileged Pod is rejected.
    rejected = create_pod(kube_api, ns, pod("user-privileged", securityContext={"privileged": True}))
    assert rejected.status == 403 and "PodSecurity" in rejected.body["message"], rejected.body

    resp = create_pod(kube_api, ns, pod("gpu"))
    assert resp.status == 201, resp.body
    stored = get_pod(kube_api, ns, "gpu")
    container = stored["spec"]["containers"][0]
    assert "privileged" not in (container.get("securityContext") or {})
    assert host_path_volumes(stored["spec"]) == []
    assert not container.get("volumeMounts")
    assert env_of(container)["LD_LIBRARY_PATH"] == LD_LIBRARY_PATH
    assert stored["metadata"]["annotations"][INJECTED].startswith("iluvatar@")
    joined = " | ".join(resp.warnings)
    assert "baseline" in joined and "privileged" in joined and "hostPath" in joined, resp.warnings

    open_ns = suite.namespace(suite.privileged_open)
    resp = create_pod(kube_api, open_ns, pod("gpu"))
    assert resp.status == 201, resp.body
    stored = get_pod(kube_api, open_ns, "gpu")
    assert stored["spec"]["containers"][0]["securityContext"]["privileged"] is True
    assert host_path_volumes(stored["spec"]) == [ILUVATAR_DRIVER]


def _restricted_compliant(body: dict[str, Any]) -> dict[str, Any]:
    """What PSA ``restricted`` asks of every pod, so that only hostPath decides its verdict."""
    body["spec"]["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    for container in body["spec"]["containers"]:
        container["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
    return body


@pytest.mark.parametrize("level", ["privileged", "baseline", "restricted"])
def test_pod_security_levels_agree_with_the_apiserver(
    kube_api: KubeAPI, suite: Suite, main: WebhookProcess, level: str
) -> None:
    """For each enforce level, the real PodSecurity admission's verdict on a hostPath pod and the
    webhook's decision to inject hostPath agree."""
    ns = suite.namespace(labels={PSA_ENFORCE: level})
    user_host_path = _restricted_compliant(pod("user-hostpath", [objects.container()]))
    user_host_path["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": "/tmp"}}]
    verdict = create_pod(kube_api, ns, user_host_path, dry_run=True)
    assert verdict.status in (201, 403), verdict.body
    apiserver_rejects = verdict.status == 403 and "PodSecurity" in verdict.body.get("message", "")
    assert apiserver_rejects is (level != "privileged"), verdict.body

    resp = create_pod(kube_api, ns, _restricted_compliant(pod("gpu")), dry_run=True)
    assert resp.status == 201, resp.body
    assert resp.body["metadata"]["annotations"][INJECTED].startswith("iluvatar@")
    injected_host_path = bool(host_path_volumes(resp.body["spec"]))
    assert injected_host_path is not apiserver_rejects, (level, resp.warnings)


@pytest.mark.parametrize("value", ["Restricted", "RESTRICTED", "Privileged", "", "latest", "v1.35"])
def test_the_apiserver_refuses_namespaces_with_a_pod_security_label_that_is_not_a_level(
    kube_api: KubeAPI, suite: Suite, value: str
) -> None:
    """Measured: PodSecurity admission validates Namespaces, so a value that is not exactly a level
    cannot be set while it is enabled. Such a label can still exist (set before PodSecurity was
    enabled, or where it is off); the webhook then reads it as PodSecurity would, as restricted
    (tests/webhook/test_core_adversarial.py)."""
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"generateName": "e2e-psa-"}}
    body["metadata"]["labels"] = {**suite.scope(), PSA_ENFORCE: value}
    resp = api(kube_api, "POST", "/api/v1/namespaces", body)
    assert resp.status == 422, resp.body
    assert "must be one of privileged, baseline, restricted" in resp.body["message"]


# --------------------------------------------------------------------------- apiserver restart


def test_namespace_cache_survives_an_apiserver_restart(
    kube_api: KubeAPI,
    suite: Suite,
    oldest_binaries: K8sBinaries,
    etcd: Etcd,
    tmp_path: Path,
) -> None:
    """A second apiserver on the session's etcd, of the same version and on the same etcd prefix,
    is the webhook's API; it is stopped and started again (same port, certificates and flags) while
    namespaces change through the session apiserver."""
    log_dir = suite.log_dir / f"restart-{suite.token}"
    log_dir.mkdir()
    private = start_kube_apiserver(
        oldest_binaries, etcd, tmp_path / "apiserver", log_dir, etcd_prefix=kube_api.etcd_prefix
    )
    server = suite.webhook_process("restart", private.kubeconfig)
    try:
        server.start(ready=True)
        before = suite.namespace(scope="restart")

        def decision(ns: str) -> str:
            response = server.post_review(review(pod("gpu"), namespace=ns))["response"]
            return "mutated" if response.get("patch") else "skipped"

        def hit_only(ns: str, expected: str) -> Callable[[], bool]:
            def check() -> bool:
                fetched = server.metric("ix_gpu_namespace_lookups_total", result="fetched")
                return (
                    decision(ns) == expected
                    and server.metric("ix_gpu_namespace_lookups_total", result="fetched") == fetched
                )

            return check

        wait_until(hit_only(before, "mutated"), "namespace in the watch cache", 30, interval=0.2)
        errors = server.metric("ix_gpu_namespace_cache_watch_errors_total")
        size = server.metric("ix_gpu_namespace_cache_size")

        # Killed, like a crash: nothing the changes below do can reach the webhook before the restart.
        private.process.stop(grace_s=0)
        # Changes while the webhook's apiserver is down: an opt-out on an old namespace, a new one.
        must(api(kube_api, "PATCH", f"/api/v1/namespaces/{before}",
                 {"metadata": {"annotations": {INJECT: "disabled"}}},
                 content_type="application/merge-patch+json"))  # fmt: skip
        during = suite.namespace(scope="restart", annotations={INJECT: "disabled"})
        private.start_again()

        # The watch resumes (or re-lists) and the cache sees both changes without direct GETs
        # (a miss would GET and fill the cache, so wait on the cache's size, not on answers).
        wait_until(hit_only(before, "skipped"), "opt-out seen after restart", 60, interval=0.2)
        wait_until(
            lambda: server.metric("ix_gpu_namespace_cache_size") > size,
            "new namespace in the cache",
            30,
            interval=0.2,
        )
        assert hit_only(during, "skipped")()
        assert server.metric("ix_gpu_namespace_cache_watch_errors_total") > errors
        # And it keeps watching: a change made after the restart arrives too.
        after = suite.namespace(scope="restart")
        wait_until(hit_only(after, "mutated"), "new namespace after restart", 30, interval=0.2)
        assert server.get("/readyz")[0] == 200
    finally:
        server.stop()
        private.stop()
