"""Read what ``ix-gpu status`` shows from the API server, with the user's kubeconfig: nodes, the pods
bound to nodes and not finished, ResourceSlices and ResourceClaims (``resource.k8s.io/v1``; none on
a cluster without it), and each device plugin's /metrics through the API server's pod proxy (the
metrics port is not reachable from outside the cluster; the proxy needs ``get pods/proxy`` in the
plugin's namespace).

Whose /metrics are believed: the pods of the chart's namespace that carry the chart's
device-plugin labels, listed there with a label selector, and of those only the ones the release's
DaemonSet controls under the ServiceAccount the release binds (:mod:`ix_gpu.status.trust`: a
namespace a tenant made under the default name holds a tenant's DaemonSet as easily as its pods).
The rest are reported and never read. Two believed pods on one node, a page that is not Prometheus
text or one that cannot be read is a note on that node alone; the other nodes keep their chips.

At size: every list is paged and each page cut down to what the view reads as it is parsed (a
5,000-node cluster's nodes and slices whole cost the CLI about 0.3 GiB); a continue token that
expires between pages (410 Gone) restarts that list, a few times; and one deadline
(``--timeout``) bounds the whole read: each request waits at most the time left, and the read
itself is abandoned when the deadline has passed, whatever a server does."""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
import urllib.error
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

from ix_gpu.config.text import one_line
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.kube.list_watch import ApiGone, ApiListWatch
from ix_gpu.status import DEFAULT_NAMESPACE, DEFAULT_SELECTOR
from ix_gpu.status.trust import Release, release_of, slim_binding, slim_daemonset, slim_owners, sort_plugins
from ix_gpu.status.view import NODE_LABELS, NodeChips, chips_from_metrics

T = TypeVar("T")

METRICS_PORT_NAME = "metrics"
LIST_ATTEMPTS = 3
"""Lists started from the first page after a 410 Gone, before the read gives up."""
DEADLINE_GRACE = 1.0
"""Seconds past the deadline that the reader gets to fail on its own, with what it was doing."""
SCRAPE_TIMEOUT = 10.0
LIST_TIMEOUT = 60.0
BINDINGS = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"


class ReadError(Exception):
    """The cluster could not be read, in one line."""


class DeadlineExceeded(ReadError):
    """The read ran past ``--timeout``: its message says what it was doing then."""


class Deadline:
    """One deadline for a whole read, with what the read was doing (for the message)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._at = clock() + seconds
        self.doing = "starting"

    def left(self) -> float:
        return self._at - self._clock()

    def passed(self) -> bool:
        return self.left() <= 0

    def exceeded(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"did not finish within --timeout {self.seconds:g} s ({self.doing})")

    def timeout(self, own: float) -> float:
        """``own``, or the time left where that is less; raises once none is left."""
        left = self.left()
        if left <= 0:
            raise self.exceeded()
        return min(own, left)


def error_text(exc: BaseException, limit: int = 500) -> str:
    """``exc`` in one line; for an HTTP error status, with the API server's reason (its Status
    ``message``: who may not do what), which urllib leaves unread in the body."""
    text = one_line(exc, limit)
    if isinstance(exc, urllib.error.HTTPError):
        with contextlib.suppress(Exception):  # no body, not JSON: the status line alone
            status = json.loads(exc.read(64 << 10))
            message = status.get("message") if isinstance(status, dict) else None
            if isinstance(message, str) and message.strip():
                text = one_line(f"{text}: {message}", limit)
    return text


def within(deadline: Deadline, work: Callable[[], T]) -> T:
    """``work()``, abandoned when it runs past the deadline: request timeouts are cut to the time
    left, but a server that trickles a byte now and then resets a socket timeout on every read.
    The work runs in a daemon thread (as do its own threads), so an abandoned one ends with us."""
    done: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            done.append((True, work()))
        except BaseException as exc:  # handed to the caller's thread
            done.append((False, exc))

    thread = threading.Thread(target=run, name="ix-gpu-status-read", daemon=True)
    thread.start()
    left = deadline.left()
    thread.join(None if math.isinf(left) else max(left, 0) + DEADLINE_GRACE)
    if not done:
        raise deadline.exceeded()
    ok, value = done[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


class BoundedApi(ApiServer):
    """``api`` whose every request waits at most the time left before the deadline, and, with a
    ``label_selector``, lists only what it selects (:class:`ApiListWatch` takes field selectors
    alone)."""

    _api: ApiServer
    _deadline: Deadline
    _label_selector: str

    def __init__(self, api: ApiServer, deadline: Deadline, label_selector: str = "") -> None:
        super().__init__(api.base_url, api.token, api.ca_file, api.ca_data, api.client_certificate)
        object.__setattr__(self, "_api", api)  # a frozen dataclass
        object.__setattr__(self, "_deadline", deadline)
        object.__setattr__(self, "_label_selector", label_selector)

    def request(self, method: str, path: str, body: Any = None, **options: Any) -> Any:
        options["timeout"] = self._deadline.timeout(float(options.get("timeout", 10)))
        if self._label_selector:
            path += ("&" if "?" in path else "?") + f"labelSelector={quote(self._label_selector, safe='')}"
        return self._api.request(method, path, body, **options)


def list_all(
    api: BoundedApi,
    path: str,
    what: str,
    deadline: Deadline,
    *,
    field_selector: str | None = None,
    slim: Callable[[Any], Any] | None = None,
) -> list[Any]:
    """Every object at ``path``, a page at a time, each cut down by ``slim`` as it is parsed. A 410
    Gone (the continue token expired: the apiserver keeps a list's snapshot for a few minutes)
    starts the list again from its first page, at most :data:`LIST_ATTEMPTS` times."""
    for attempt in range(1, LIST_ATTEMPTS + 1):
        deadline.doing = f"listing {what}" + (f", attempt {attempt}" if attempt > 1 else "")
        lister = ApiListWatch(
            api, path, what, list_timeout=LIST_TIMEOUT, field_selector=field_selector, slim=slim
        )
        try:
            items, _ = lister.list()
            return items
        except ApiGone:
            continue
    raise ReadError(
        f"listing {what}: 410 Gone {LIST_ATTEMPTS} times (the list's continue token expired before "
        "its last page was read each time); try again"
    )


def list_if_served(
    api: BoundedApi, path: str, what: str, deadline: Deadline, slim: Callable[[Any], Any]
) -> list[Any]:
    """``list_all``, or nothing where the API server does not serve the resource (404)."""
    try:
        return list_all(api, path, what, deadline, slim=slim)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def _at(obj: Any, key: str) -> Any:
    """``obj[key]`` where ``obj`` is a mapping that has it, else None."""
    return obj.get(key) if isinstance(obj, Mapping) else None


def _pick(obj: Any, *keys: str) -> dict[str, Any]:
    """The ``keys`` that ``obj`` (a mapping, or nothing) has, and only those: a field that was
    absent stays absent, so the view reads its own default as it would from the whole object."""
    source = obj if isinstance(obj, Mapping) else {}
    return {k: source[k] for k in keys if k in source}


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What the view and the plugin lookup read of a pod, kept as each page is parsed: a cluster's
    pods whole would cost the CLI gigabytes (150,000 pods at several KB each)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}

    def container(c: dict[str, Any]) -> dict[str, Any]:
        return {"resources": c.get("resources") or {}, "ports": c.get("ports") or []}

    return {
        "metadata": {k: meta.get(k) for k in ("namespace", "name", "labels")},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [container(c) for c in spec.get("containers") or []],
            "initContainers": [container(c) for c in spec.get("initContainers") or []],
        },
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def slim_node(resource: str) -> Callable[[Any], dict[str, Any]]:
    """A node as the view reads it: its name, the labels of :data:`NODE_LABELS` and the allocatable
    count of ``resource``. Whole, a node is 5-20 KB (images, conditions, managedFields)."""

    def slim(node: Any) -> dict[str, Any]:
        meta = _at(node, "metadata")
        status = _at(node, "status")
        node_labels = _at(meta, "labels")
        allocatable = _at(status, "allocatable")
        return {
            "metadata": {**_pick(meta, "name"), "labels": _pick(node_labels, *NODE_LABELS)},
            "status": {"allocatable": _pick(allocatable, resource)},
        }

    return slim


def slim_slice(driver: str) -> Callable[[Any], dict[str, Any]]:
    """A ResourceSlice as the view reads it: driver, node and pool, and for ``driver``'s slices each
    device's name, uuid and defaultForm attributes, taint effects and the counters it consumes
    (their names: the amounts count for nothing here). Another driver's devices are dropped."""

    def device(found: Any) -> dict[str, Any]:
        attributes = _at(found, "attributes")
        out = {**_pick(found, "name"), "attributes": _pick(attributes, "uuid", "defaultForm")}
        out["taints"] = [_pick(t, "effect") for t in _at(found, "taints") or []]
        out["consumesCounters"] = [
            {**_pick(use, "counterSet"), "counters": list(_at(use, "counters") or {})}
            for use in _at(found, "consumesCounters") or []
        ]
        return out

    def slim(slice_: Any) -> dict[str, Any]:
        spec = _at(slice_, "spec")
        out = _pick(spec, "driver", "nodeName")
        out["pool"] = _pick(_at(spec, "pool"), "name")
        ours = out.get("driver") == driver
        out["devices"] = [device(d) for d in _at(spec, "devices") or []] if ours else []
        return {"spec": out}

    return slim


def slim_claim(claim: Any) -> dict[str, Any]:
    """A ResourceClaim as the view reads it: its name, each allocated device (driver, pool, device)
    and the objects it is reserved for (resource, name)."""
    meta = _at(claim, "metadata")
    status = _at(claim, "status")
    allocation = _at(status, "allocation")
    devices = _at(allocation, "devices")
    results = _at(devices, "results") or []
    reserved = _at(status, "reservedFor") or []
    return {
        "metadata": _pick(meta, "namespace", "name"),
        "status": {
            "allocation": {"devices": {"results": [_pick(r, "driver", "pool", "device") for r in results]}},
            "reservedFor": [_pick(r, "resource", "name") for r in reserved],
        },
    }


def _in_threads(work: Callable[[T], Any], items: Sequence[T], workers: int) -> list[Any]:
    """``work`` over ``items`` in up to ``workers`` daemon threads (a ThreadPoolExecutor's threads
    are joined at interpreter exit: one stuck on a socket would hold an abandoned read's exit).
    The first exception ``work`` raised is raised here once every thread is done."""
    results: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    queue = iter(range(len(items)))
    lock = threading.Lock()

    def run() -> None:
        while True:
            with lock:
                index = next(queue, None)
            if index is None:
                return
            try:
                results[index] = work(items[index])
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _pod_name(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"


def scrape(api: ApiServer, pod: Mapping[str, Any]) -> tuple[str, NodeChips]:
    """One device-plugin pod's chips from its /metrics, or why there are none (the node's note)."""
    spec, name = pod["spec"], _pod_name(pod)
    node = spec.get("nodeName") or ""
    port = next(
        (
            p.get("containerPort")
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if p.get("name") == METRICS_PORT_NAME
        ),
        None,
    )
    phase = (pod.get("status") or {}).get("phase")
    if port is None:
        return node, f"chips unknown: the device-plugin pod {name} has no port named {METRICS_PORT_NAME}"
    if phase != "Running":
        return node, f"chips unknown: the device-plugin pod {name} is {phase or 'not running'}"
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{quote(meta['namespace'])}/pods/{quote(meta['name'])}:{port}/proxy/metrics"
    try:
        text = api.request(
            "GET", path, accept="text/plain", timeout=SCRAPE_TIMEOUT, max_bytes=32 << 20, parse=bytes.decode
        )
    except OSError as exc:
        return (
            node,
            f"chips unknown: the device plugin's /metrics could not be read ({name}: {error_text(exc, 200)})",
        )
    try:
        return node, chips_from_metrics(str(text or ""), node)
    except Exception as exc:  # the parser's errors are not one documented family
        reason = one_line(f"{type(exc).__name__}: {exc}", 200)
        return node, f"chips unknown: {name}'s /metrics is not Prometheus text ({reason})"


def plugin_chips(
    api: ApiServer, pods: Iterable[Mapping[str, Any]], workers: int = 16
) -> dict[str, NodeChips]:
    """Each node's chips, from the one device-plugin pod there, read side by side (a node that does
    not answer costs its own timeout, not the whole view); a note where there are none."""
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node:
            by_node.setdefault(node, []).append(pod)
    found: dict[str, NodeChips] = {}
    alone = []
    for node, there in by_node.items():
        if len(there) == 1:
            alone.append(there[0])
            continue
        count = "two" if len(there) == 2 else str(len(there))
        found[node] = f"{count} device-plugin pods on this node: {', '.join(sorted(map(_pod_name, there)))}"
    found.update(_in_threads(lambda pod: scrape(api, pod), alone, workers))
    return found


def read_cluster(
    api: ApiServer,
    *,
    resource: str,
    driver: str,
    chips: bool = True,
    namespace: str = DEFAULT_NAMESPACE,
    selector: str = DEFAULT_SELECTOR,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """Everything :func:`ix_gpu.status.view.cluster_status` takes, as keyword arguments. Raises
    ``OSError`` or :class:`ReadError` (:class:`DeadlineExceeded` once ``deadline`` has passed)."""
    deadline = deadline or Deadline(math.inf)
    bounded = BoundedApi(api, deadline)
    nodes = list_all(bounded, "/api/v1/nodes", "nodes", deadline, slim=slim_node(resource))
    pods = list_all(
        bounded,
        "/api/v1/pods",
        "pods",
        deadline,
        field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
        slim=slim_pod,
    )
    resources = "/apis/resource.k8s.io/v1"
    slices = list_if_served(
        bounded, f"{resources}/resourceslices", "ResourceSlices", deadline, slim_slice(driver)
    )
    claims = (
        list_if_served(bounded, f"{resources}/resourceclaims", "ResourceClaims", deadline, slim_claim)
        if slices
        else []
    )
    found: dict[str, NodeChips] = {}
    plugins: list[Any] = []
    untrusted: list[dict[str, str]] = []
    if chips:
        selected = BoundedApi(api, deadline, selector)
        listed = list_all(
            selected,
            f"/api/v1/namespaces/{quote(namespace, safe='')}/pods",
            f"device-plugin pods in {namespace}",
            deadline,
            field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
            slim=lambda pod: {**slim_pod(pod), **slim_owners(pod)},
        )
        if listed:  # else there is nothing to check, and nothing more to ask the API server
            plugins, untrusted = sort_plugins(listed, read_release(selected, namespace, selector, deadline))
        deadline.doing = f"reading the /metrics of {len(plugins)} device-plugin pods"
        found = plugin_chips(bounded, plugins)
        if deadline.passed():  # the scrapes that failed, failed for want of time
            raise deadline.exceeded()
    no_plugin = f"chips unknown: no device-plugin pod on this node (namespace {namespace}, labels {selector})"
    return {
        "nodes": nodes,
        "pods": pods,
        "slices": slices,
        "claims": claims,
        "chips": found,
        "no_plugin": no_plugin if chips else "",
        "untrusted": untrusted,
    }


def read_release(selected: BoundedApi, namespace: str, selector: str, deadline: Deadline) -> Release:
    """The release's device-plugin DaemonSets and the ServiceAccounts its ClusterRoleBindings bind
    (``selected``: the API with ``selector``); a refused list is a problem of the release (no pod is
    believed then) and not of the whole read, as the chips are not the only thing shown."""
    try:
        daemonsets = f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/daemonsets"
        return release_of(
            namespace,
            selector,
            list_all(selected, daemonsets, f"DaemonSets in {namespace}", deadline, slim=slim_daemonset),
            list_all(selected, BINDINGS, "ClusterRoleBindings", deadline, slim=slim_binding),
        )
    except urllib.error.HTTPError as exc:
        why = f"its DaemonSet or the release's ClusterRoleBindings could not be read ({error_text(exc, 200)})"
        return Release(namespace, selector, {}, frozenset(), problem=why)
