"""``webhook.listenAddress``, ``plugin.listenAddress`` and ``dra.listenAddress``: each component's
listen address reaches its process as the flag it reads (``--host``, ``--metrics-host``), ``::``
(both IP families) by default, quoted so YAML keeps ``--host=::`` a string, and parsed by the CLI as
the chart wrote it. An ``IX_GPU_*`` variable for the same flag in ``extraEnv`` (the pod IP from the
downward API, which the real-cluster tier uses) keeps working: the chart then passes no flag that
would silently win over it. The schema refuses an empty address and URL brackets."""

from __future__ import annotations

from typing import Any

import pytest

from ix_gpu.cli import build_parser
from tests.chart.rendering import HelmError, chart, find, render

NAMESPACE = "ix-gpu-system"
DRA_ON = {"dra": {"enabled": True}}
COMPONENTS = (
    # (values key, object kind, object name, flag, parsed attribute, variable)
    ("webhook", "Deployment", "ixg-ix-gpu-webhook", "--host", "host", "IX_GPU_HOST"),
    ("plugin", "DaemonSet", "ixg-ix-gpu-plugin", "--metrics-host", "metrics_host", "IX_GPU_METRICS_HOST"),
    ("dra", "DaemonSet", "ixg-ix-gpu-dra", "--metrics-host", "metrics_host", "IX_GPU_METRICS_HOST"),
)
POD_IP = {"name": "", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def container(values: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    pod = find(render({**DRA_ON, **values}), kind, name)["spec"]["template"]["spec"]
    first: dict[str, Any] = pod["containers"][0]
    return first


def values_for(component: str, **settings: Any) -> dict[str, Any]:
    """``settings`` under ``component`` (the DRA plugin stays enabled)."""
    return {component: {**DRA_ON["dra"], **settings} if component == "dra" else settings}


@pytest.mark.parametrize(("component", "kind", "name", "flag", "attribute", "_variable"), COMPONENTS)
def test_the_default_is_both_families_and_the_cli_reads_it(
    component: str, kind: str, name: str, flag: str, attribute: str, _variable: str
) -> None:
    args = container({}, kind, name)["args"]
    assert f"{flag}=::" in args
    assert [a for a in args if a.startswith(f"{flag}=")] == [f"{flag}=::"]  # exactly one
    assert getattr(build_parser().parse_args(args), attribute) == "::"
    assert chart().values[component]["listenAddress"] == "::"


@pytest.mark.parametrize(("component", "kind", "name", "flag", "attribute", "_variable"), COMPONENTS)
@pytest.mark.parametrize("address", ["0.0.0.0", "127.0.0.1", "fd00::10", "fe80::1%eth0"])
def test_an_address_is_passed_as_given(
    component: str, kind: str, name: str, flag: str, attribute: str, _variable: str, address: str
) -> None:
    args = container(values_for(component, listenAddress=address), kind, name)["args"]
    assert f"{flag}={address}" in args
    assert getattr(build_parser().parse_args(args), attribute) == address


@pytest.mark.parametrize(("component", "kind", "name", "flag", "_attribute", "variable"), COMPONENTS)
def test_the_flags_variable_in_extra_env_takes_its_place(
    component: str, kind: str, name: str, flag: str, _attribute: str, variable: str
) -> None:
    env = [{**POD_IP, "name": variable}]
    found = container(values_for(component, extraEnv=env), kind, name)
    assert not [a for a in found["args"] if a.startswith(f"{flag}=")]
    assert {**POD_IP, "name": variable} in found["env"]
    # Another variable is no reason to drop the flag.
    other = container(values_for(component, extraEnv=[{"name": "IX_GPU_OTHER", "value": "x"}]), kind, name)
    assert f"{flag}=::" in other["args"]


@pytest.mark.parametrize("component", ["webhook", "plugin", "dra"])
@pytest.mark.parametrize("address", ["", "[::]", "0.0.0.0 ", "::/0"])
def test_the_schema_refuses_malformed_addresses(component: str, address: str) -> None:
    with pytest.raises(HelmError, match=r"schema"):
        chart().render({component: {"listenAddress": address}}, name="ixg", namespace=NAMESPACE)
