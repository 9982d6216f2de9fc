"""Which of the pods listed as device plugins ``ix-gpu status`` believes, and why not the others.

A pod's namespace and labels prove little where tenants may create namespaces: a tenant's own
``ix-gpu-system`` (the default ``--namespace``) holds whatever pods, DaemonSets and ServiceAccounts
the tenant makes there, and an operator whose release lives elsewhere and who forgets ``-n`` would
read their /metrics as the cluster's chips. What a tenant cannot make is cluster-scoped: the chart's
ClusterRoleBinding of the plugin's ServiceAccount. So a pod is believed only when

- its controller (the ownerReference with ``controller: true``) is a DaemonSet of ``--namespace``
  with ``--selector``'s labels, matched by the UID read from the API (a DaemonSet deleted and made
  again under the same name is another one; the name a reference carries proves nothing);
- it runs as that DaemonSet's ServiceAccount;
- and that ServiceAccount is a subject of a ClusterRoleBinding with ``--selector``'s labels, which
  only whoever may bind cluster roles (the release's installer) can have made.

Every other pod is reported, with the first of these it fails, and its /metrics are never read.
The chart makes that binding whenever the plugin talks to the API server (``plugin.nodeLabels``,
the default, per-node configs or DRA); without one no plugin pod can be told from a tenant's.

Pure: :mod:`ix_gpu.status.read` lists the objects and cuts each down with the ``slim_*`` here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ix_gpu.config.text import shown


def _at(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def _account(pod_spec: Any) -> str:
    """The ServiceAccount a pod spec runs as (``default`` when it names none, as admission sets it)."""
    return str(_at(pod_spec, "serviceAccountName") or "default")


def slim_owners(pod: Any) -> dict[str, Any]:
    """What the verdict reads of a listed plugin pod, beside what the view reads: its controller's
    reference and its ServiceAccount."""
    meta = _at(pod, "metadata")
    controllers = [
        {k: _at(ref, k) for k in ("apiVersion", "kind", "name", "uid")}
        for ref in _at(meta, "ownerReferences") or []
        if _at(ref, "controller") is True
    ]
    return {"controllers": controllers[:1], "serviceAccount": _account(_at(pod, "spec"))}


def slim_daemonset(daemonset: Any) -> dict[str, str]:
    meta = _at(daemonset, "metadata")
    pod_spec = _at(_at(_at(daemonset, "spec"), "template"), "spec")
    return {"uid": str(_at(meta, "uid")), "name": str(_at(meta, "name")), "account": _account(pod_spec)}


def slim_binding(binding: Any) -> list[list[str]]:
    """The ServiceAccounts a ClusterRoleBinding binds, each ``[namespace, name]``."""
    return [
        [str(_at(s, "namespace")), str(_at(s, "name"))]
        for s in _at(binding, "subjects") or []
        if _at(s, "kind") == "ServiceAccount"
    ]


@dataclass(frozen=True)
class Release:
    """The release's device-plugin DaemonSets as read from the API, and the ServiceAccounts its
    ClusterRoleBindings bind; ``problem``: why they could not be read (no pod is believed then)."""

    namespace: str
    selector: str
    daemonsets: Mapping[str, tuple[str, str]]
    """UID → (name, ServiceAccount) of each DaemonSet of the namespace with the selector's labels."""
    bound: frozenset[tuple[str, str]]
    """(namespace, name) of each ServiceAccount a ClusterRoleBinding with those labels binds."""
    problem: str = ""


def release_of(
    namespace: str,
    selector: str,
    daemonsets: Iterable[Mapping[str, str]],
    bindings: Iterable[Sequence[Sequence[str]]],
) -> Release:
    """A :class:`Release` from the listed (and slimmed) DaemonSets and ClusterRoleBindings."""
    return Release(
        namespace,
        selector,
        {d["uid"]: (d["name"], d["account"]) for d in daemonsets},
        frozenset((ns, name) for subjects in bindings for ns, name in subjects),
    )


def doubt(pod: Mapping[str, Any], release: Release) -> str | None:
    """Why ``pod`` (slimmed with :func:`slim_owners` merged in) is not believed; None when it is."""
    if release.problem:
        return release.problem
    controllers = pod.get("controllers") or []
    if not controllers:
        return "it has no controller (no ownerReference with controller: true)"
    ref = controllers[0]
    kind, name, uid = ref.get("kind"), ref.get("name"), ref.get("uid")
    if (ref.get("apiVersion"), kind) != ("apps/v1", "DaemonSet"):
        return f"its controller is {shown(kind)} {shown(name)}, not a DaemonSet"
    found = release.daemonsets.get(str(uid))
    if found is None:
        same = [u for u, (n, _) in release.daemonsets.items() if n == name]
        if same:
            return (
                f"its controller, DaemonSet {shown(name)}, has UID {shown(uid)}: "
                f"the DaemonSet of that name now has {same[0]}"
            )
        return (
            f"its controller, DaemonSet {shown(name)}, is not a DaemonSet of namespace "
            f"{release.namespace} with labels {release.selector}"
        )
    daemonset, account = found
    if pod.get("serviceAccount") != account:
        return (
            f"it runs as ServiceAccount {shown(pod.get('serviceAccount'))}, not as its DaemonSet's {account}"
        )
    if (release.namespace, account) in release.bound:
        return None
    elsewhere = sorted(f"{ns}/{sa}" for ns, sa in release.bound)
    hint = (
        f"; those labels bind {', '.join(elsewhere)}: is the release there (--namespace)?"
        if elsewhere
        else ""
    )
    return (
        f"its DaemonSet {daemonset} runs as ServiceAccount {release.namespace}/{account}, which no "
        f"ClusterRoleBinding with labels {release.selector} binds{hint}"
    )


def sort_plugins(
    pods: Iterable[Mapping[str, Any]], release: Release
) -> tuple[list[Mapping[str, Any]], list[dict[str, str]]]:
    """The pods believed, and each other pod as ``{"pod", "node", "reason"}`` (the view's report)."""
    believed: list[Mapping[str, Any]] = []
    doubted: list[dict[str, str]] = []
    for pod in pods:
        why = doubt(pod, release)
        if why is None:
            believed.append(pod)
            continue
        meta = pod.get("metadata") or {}
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        doubted.append(
            {"pod": name, "node": str((pod.get("spec") or {}).get("nodeName") or ""), "reason": why}
        )
    return believed, doubted
