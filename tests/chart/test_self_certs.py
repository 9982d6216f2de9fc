"""webhook/certs/self_mode.py and self_mode_cli.py against a local stand-in of the apiserver's
Secret and webhook configuration endpoints (resourceVersion conflicts, create-if-absent, JSON patch
with test ops).

The adapter over the API server is exercised by the install test on the real
apiserver (tests/chart/test_chart_install.py)."""

from __future__ import annotations

import argparse
import base64
import copy
import datetime as dt
import threading
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from cryptography import x509

from ix_gpu.cli import UsageError
from ix_gpu.webhook.certs import self_mode, self_mode_cli
from ix_gpu.webhook.certs.self_mode import Owner, SelfCertManager, SelfCertSettings, StoredSecret
from ix_gpu.webhook.certs.self_mode_material import CA_BUNDLE, CA_CERT, TLS_CERT, TLS_KEY, SelfCertError
from tests.chart.rendering import NAMESPACE, find, render
from tests.support.waiting import wait_until

DNS = ("ixg-ix-gpu-webhook.ix-gpu-system.svc",)
MWC = "ixg-ix-gpu"
CHART_WEBHOOKS = (
    "pods.v1.ix-gpu.io",
    "tfjobs.v1.kubeflow.org.ix-gpu.io",
    "tfjobs.v1beta1.mlkube.io.ix-gpu.io",
)
"""The webhooks of the chart's configuration with the default values (one per workload)."""


class StandIn:
    """The apiserver as self mode sees it: one namespace's Secrets and one configuration."""

    def __init__(self, webhooks: tuple[str, ...] = CHART_WEBHOOKS) -> None:
        self.lock = threading.Lock()
        self.version = 0
        self.secrets: dict[str, tuple[dict[str, bytes], str]] = {}
        self.owners: dict[str, Owner | None] = {}
        self.mwc_uid: str | None = "mwc-uid-1"
        self.mwc: dict[str, Any] = {
            "webhooks": [{"name": n, "clientConfig": {"service": {}}} for n in webhooks]
        }
        self.calls: list[str] = []

    def _next(self) -> str:
        self.version += 1
        return str(self.version)

    def read_secret(self, namespace: str, name: str) -> StoredSecret | None:
        with self.lock:
            self.calls.append("read")
            hit = self.secrets.get(f"{namespace}/{name}")
            return None if hit is None else StoredSecret(dict(hit[0]), hit[1])

    def create_secret(self, namespace: str, name: str, data: dict[str, bytes], owner: Owner | None) -> bool:
        with self.lock:
            if f"{namespace}/{name}" in self.secrets:
                self.calls.append("create-conflict")
                return False
            self.calls.append("create")
            self.secrets[f"{namespace}/{name}"] = (dict(data), self._next())
            self.owners[f"{namespace}/{name}"] = owner
            return True

    def replace_secret(
        self, namespace: str, name: str, data: dict[str, bytes], resource_version: str, owner: Owner | None
    ) -> bool:
        with self.lock:
            current = self.secrets.get(f"{namespace}/{name}")
            if current is None or current[1] != resource_version:
                self.calls.append("replace-conflict")
                return False
            self.calls.append("replace")
            self.secrets[f"{namespace}/{name}"] = (dict(data), self._next())
            self.owners[f"{namespace}/{name}"] = owner  # a PUT replaces the ownerReferences too
            return True

    def configuration_uid(self, configuration: str) -> str | None:
        assert configuration == MWC
        return self.mwc_uid

    def read_ca_bundles(self, configuration: str) -> list[tuple[str, bytes | None]]:
        assert configuration == MWC
        with self.lock:
            return [
                (
                    w["name"],
                    base64.b64decode(w["clientConfig"]["caBundle"])
                    if "caBundle" in w["clientConfig"]
                    else None,
                )
                for w in self.mwc["webhooks"]
            ]

    def patch_ca_bundles(self, configuration: str, patch: list[dict[str, Any]]) -> None:
        assert configuration == MWC
        with self.lock:
            self.calls.append("patch")
            self.mwc = jsonpatch.apply_patch(self.mwc, patch)  # raises on a failed test op

    # helpers for assertions
    def secret(self) -> dict[str, bytes]:
        return self.secrets[f"{NAMESPACE}/webhook-tls"][0]

    def bundles(self) -> set[bytes]:
        return {base64.b64decode(w["clientConfig"]["caBundle"]) for w in self.mwc["webhooks"]}


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime.now(dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now


def _settings(cert_dir: Path, **kw: Any) -> SelfCertSettings:
    return SelfCertSettings(
        namespace=NAMESPACE,
        secret_name="webhook-tls",
        webhook_configuration=MWC,
        dns_names=DNS,
        cert_dir=cert_dir,
        **kw,
    )


def _manager(api: StandIn, cert_dir: Path, clock: Clock | None = None, **kw: Any) -> SelfCertManager:
    return SelfCertManager(_settings(cert_dir, **kw), api, clock=clock or Clock())


def _trusted_by(bundle: bytes, cert_pem: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    for ca in x509.load_pem_x509_certificates(bundle):
        try:
            cert.verify_directly_issued_by(ca)
            return True
        except Exception:
            continue
    return False


@pytest.fixture
def order_check(monkeypatch: pytest.MonkeyPatch) -> list[StandIn]:
    """Every certificate written to a cert dir must already be trusted by the live caBundle."""
    apis: list[StandIn] = []
    real = self_mode.write_pair

    def checked(cert_dir: Path, cert: bytes, key: bytes) -> None:
        for api in apis:
            for bundle in api.bundles():
                assert _trusted_by(bundle, cert), "a certificate was served before its CA was in the caBundle"
        real(cert_dir, cert, key)

    monkeypatch.setattr(self_mode, "write_pair", checked)
    return apis


def test_first_start_creates_secret_patches_ca_bundle_and_writes_cert(
    tmp_path: Path, order_check: list[StandIn]
) -> None:
    api = StandIn()
    order_check.append(api)
    manager = _manager(api, tmp_path)
    manager.ensure()
    secret = api.secret()
    assert set(secret) == {"ca.crt", "ca.key", "ca-bundle.crt", "tls.crt", "tls.key"}
    assert api.bundles() == {secret[CA_CERT]}
    assert (tmp_path / "tls.crt").read_bytes() == secret[TLS_CERT]
    assert (tmp_path / "tls.key").read_bytes() == secret[TLS_KEY]
    assert oct((tmp_path / "tls.key").stat().st_mode & 0o777) == "0o600"
    cert = x509.load_pem_x509_certificate(secret[TLS_CERT])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert tuple(sans.get_values_for_type(x509.DNSName)) == DNS
    assert _trusted_by(secret[CA_CERT], secret[TLS_CERT])
    assert manager.events == ["created", "patched-ca-bundle", "wrote-cert"]
    # Owned by the configuration: deleting it (helm uninstall) garbage-collects the Secret.
    assert api.owners[f"{NAMESPACE}/webhook-tls"] == Owner(MWC, "mwc-uid-1")
    # A second pass changes nothing: no write, no patch.
    api.calls.clear()
    manager.ensure()
    assert api.calls == ["read"]


def test_a_restart_adopts_the_existing_secret(tmp_path: Path) -> None:
    api = StandIn()
    _manager(api, tmp_path / "a").ensure()
    before = copy.deepcopy(api.secret())
    restarted = _manager(api, tmp_path / "b")
    restarted.ensure()
    assert api.secret() == before
    assert (tmp_path / "b" / "tls.crt").read_bytes() == before[TLS_CERT]
    assert "patch" not in api.calls[api.calls.index("create") + 2 :]


def test_concurrent_replicas_converge_on_one_secret(tmp_path: Path) -> None:
    api = StandIn()
    replicas = 6
    barrier = threading.Barrier(replicas)
    errors: list[BaseException] = []

    def start(i: int) -> None:
        manager = _manager(api, tmp_path / str(i))
        barrier.wait()
        try:
            manager.ensure()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert api.calls.count("create") == 1
    served = {(tmp_path / str(i) / "tls.crt").read_bytes() for i in range(replicas)}
    assert served == {api.secret()[TLS_CERT]}
    assert api.bundles() == {api.secret()[CA_CERT]}


def test_renewal_reissues_from_the_same_ca_without_touching_the_ca_bundle(
    tmp_path: Path, order_check: list[StandIn]
) -> None:
    api = StandIn()
    order_check.append(api)
    clock = Clock()
    manager = _manager(api, tmp_path, clock, validity=dt.timedelta(days=90))
    manager.ensure()
    first = copy.deepcopy(api.secret())
    clock.now += dt.timedelta(days=50)  # 40 of 90 days left: still fine
    manager.ensure()
    assert api.secret() == first
    clock.now += dt.timedelta(days=15)  # 25 of 90 days left: under a third
    api.calls.clear()
    manager.ensure()
    renewed = api.secret()
    assert renewed[TLS_CERT] != first[TLS_CERT]
    assert (renewed[CA_CERT], renewed["ca.key"]) == (first[CA_CERT], first["ca.key"])
    assert "patch" not in api.calls
    assert api.bundles() == {first[CA_CERT]}
    assert _trusted_by(first[CA_CERT], renewed[TLS_CERT])
    assert (tmp_path / "tls.crt").read_bytes() == renewed[TLS_CERT]
    assert manager.events[-2:] == ["renewed", "wrote-cert"]


def test_replicas_renewing_at_once_agree_and_the_other_adopts(tmp_path: Path) -> None:
    api = StandIn()
    clock = Clock()
    a = _manager(api, tmp_path / "a", clock)
    b = _manager(api, tmp_path / "b", clock)
    a.ensure()
    b.ensure()
    clock.now += dt.timedelta(days=80)
    # Both read the same Secret version; only one replace can win.
    stored = api.read_secret(NAMESPACE, "webhook-tls")
    assert stored is not None
    api.replace_secret(
        NAMESPACE,
        "webhook-tls",
        {**stored.data, TLS_CERT: stored.data[TLS_CERT]},
        stored.resource_version,
        Owner(MWC, "mwc-uid-1"),
    )
    a.ensure()
    b.ensure()
    assert (
        (tmp_path / "a" / "tls.crt").read_bytes()
        == (tmp_path / "b" / "tls.crt").read_bytes()
        == api.secret()[TLS_CERT]
    )
    assert (a.events.count("renewed"), b.events.count("renewed")) == (1, 0)
    assert "adopted" in b.events


def test_conflicting_replace_is_retried_from_a_fresh_read(tmp_path: Path) -> None:
    api = StandIn()
    clock = Clock()
    manager = _manager(api, tmp_path, clock)
    manager.ensure()
    clock.now += dt.timedelta(days=80)
    real_read = api.read_secret
    raced: list[bool] = []

    def racing_read(namespace: str, name: str) -> StoredSecret | None:
        got = real_read(namespace, name)
        if not raced and got is not None:  # another replica writes right after our first read
            raced.append(True)
            api.replace_secret(namespace, name, got.data, got.resource_version, Owner(MWC, "mwc-uid-1"))
        return got

    api.read_secret = racing_read  # type: ignore[method-assign]
    manager.ensure()
    assert api.calls.count("replace-conflict") == 1
    assert (tmp_path / "tls.crt").read_bytes() == api.secret()[TLS_CERT]


def test_ca_about_to_expire_is_rotated_with_both_cas_trusted_first(
    tmp_path: Path, order_check: list[StandIn]
) -> None:
    api = StandIn()
    order_check.append(api)
    clock = Clock()
    manager = _manager(
        api, tmp_path, clock, ca_validity=dt.timedelta(days=100), validity=dt.timedelta(days=30)
    )
    manager.ensure()
    old_ca = api.secret()[CA_CERT]
    clock.now += dt.timedelta(days=80)  # CA has 20 days left < a new cert's 30
    manager.ensure()
    secret = api.secret()
    assert secret[CA_CERT] != old_ca
    bundle = secret[CA_BUNDLE]
    assert bundle.startswith(secret[CA_CERT]) and old_ca in bundle
    assert api.bundles() == {bundle}
    assert _trusted_by(bundle, secret[TLS_CERT]) and not _trusted_by(old_ca, secret[TLS_CERT])
    assert manager.events[-3:] == ["rotated-ca", "patched-ca-bundle", "wrote-cert"]


def test_a_ca_bundle_changed_out_of_band_is_repaired(tmp_path: Path) -> None:
    api = StandIn()
    manager = _manager(api, tmp_path)
    manager.ensure()
    api.mwc["webhooks"][1]["clientConfig"].pop("caBundle")  # e.g. re-applied without the field
    manager.ensure()
    assert api.bundles() == {api.secret()[CA_CERT]}
    assert all("caBundle" in w["clientConfig"] for w in api.mwc["webhooks"])


def test_changed_service_dns_reissues_from_the_same_ca(tmp_path: Path) -> None:
    api = StandIn()
    _manager(api, tmp_path).ensure()
    ca = api.secret()[CA_CERT]
    renamed = SelfCertManager(
        SelfCertSettings(NAMESPACE, "webhook-tls", MWC, ("new-name.ix-gpu-system.svc",), tmp_path), api
    )
    renamed.ensure()
    cert = x509.load_pem_x509_certificate(api.secret()[TLS_CERT])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["new-name.ix-gpu-system.svc"]
    assert api.secret()[CA_CERT] == ca


def test_a_damaged_secret_is_replaced(tmp_path: Path) -> None:
    api = StandIn()
    api.secrets[f"{NAMESPACE}/webhook-tls"] = ({"tls.crt": b"junk"}, "7")
    manager = _manager(api, tmp_path)
    manager.ensure()
    assert set(api.secret()) >= {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert manager.events[0] == "rotated-ca"
    assert _trusted_by(api.secret()[CA_CERT], (tmp_path / "tls.crt").read_bytes())


def test_a_reordered_configuration_fails_the_patch_instead_of_misplacing_it(tmp_path: Path) -> None:
    api = StandIn()
    real_read = api.read_ca_bundles

    def read_then_reorder(configuration: str) -> list[tuple[str, bytes | None]]:
        got = real_read(configuration)
        api.mwc["webhooks"].reverse()
        return got

    api.read_ca_bundles = read_then_reorder  # type: ignore[method-assign]
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        _manager(api, tmp_path).ensure()
    assert not (tmp_path / "tls.crt").exists(), "nothing served before the caBundle is in place"


def test_no_webhooks_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SelfCertError, match="no webhooks"):
        _manager(StandIn(webhooks=()), tmp_path).ensure()


def test_background_loop_renews_and_serves(tmp_path: Path) -> None:
    api = StandIn()
    clock = Clock()
    manager = _manager(api, tmp_path, clock, check_interval=0.05)
    manager.ensure()
    first = (tmp_path / "tls.crt").read_bytes()
    stop = manager.start()
    try:
        clock.now += dt.timedelta(days=80)
        wait_until(
            lambda: (tmp_path / "tls.crt").read_bytes() != first, "the renewed certificate", 10, interval=0.05
        )
    finally:
        stop.set()
    assert (tmp_path / "tls.crt").read_bytes() == api.secret()[TLS_CERT] != first


# --------------------------------------------------------------------------- flags and the chart


def _webhook_parser() -> argparse.ArgumentParser:
    from ix_gpu.webhook.service.service_cli import register_service

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register_service(sub)  # includes the self-cert flags
    return parser


def test_the_charts_webhook_args_parse_and_give_the_settings() -> None:
    deployment = find(render(), "Deployment", "ixg-ix-gpu-webhook")
    args = _webhook_parser().parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    settings = self_mode_cli.settings_from_args(args)
    assert settings == SelfCertSettings(
        namespace=NAMESPACE,
        secret_name="ixg-ix-gpu-webhook-tls",
        webhook_configuration=MWC,
        dns_names=DNS,
        cert_dir=Path("/run/ix-gpu/certs"),
        validity=dt.timedelta(days=90),
    )
    configured = {h["name"] for h in find(render(), "MutatingWebhookConfiguration", MWC)["webhooks"]}
    assert configured == set(CHART_WEBHOOKS)
    role = find(render(), "Role", "ixg-ix-gpu-webhook")
    assert role["rules"][0]["resourceNames"] == [settings.secret_name]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--self-certs-secret", "no-slash", "--webhook-configuration", "m", "--service-dns", "d"],
            "NAMESPACE/NAME",
        ),
        (["--self-certs-secret", "ns/n", "--service-dns", "d"], "--webhook-configuration"),
        (["--self-certs-secret", "ns/n", "--webhook-configuration", "m"], "--service-dns"),
        (["--webhook-configuration", "m"], "need --self-certs-secret"),
        (
            [
                "--self-certs-secret",
                "ns/n",
                "--webhook-configuration",
                "m",
                "--service-dns",
                "d",
                "--self-certs-validity-days",
                "1",
            ],
            "between 2 and 3650",
        ),
    ],
)
def test_bad_self_cert_flags_are_usage_errors(argv: list[str], message: str) -> None:
    args = _webhook_parser().parse_args(["webhook", *argv])
    with pytest.raises(UsageError, match=message):
        self_mode_cli.settings_from_args(args)


def test_without_the_flags_nothing_happens() -> None:
    args = _webhook_parser().parse_args(["webhook"])
    assert self_mode_cli.start_from_args(args) is None


def test_start_from_args_prepares_the_cert_dir_before_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ix_gpu.process import json_logging

    monkeypatch.setattr(json_logging, "configure", lambda level: None)  # keep pytest's log capture
    api = StandIn()
    args = _webhook_parser().parse_args(
        [
            "webhook",
            "--cert-dir",
            str(tmp_path),
            "--self-certs-secret",
            f"{NAMESPACE}/webhook-tls",
            "--webhook-configuration",
            MWC,
            "--service-dns",
            DNS[0],
        ]
    )
    manager = self_mode_cli.start_from_args(args, api=api)
    assert manager is not None
    assert (tmp_path / "tls.crt").read_bytes() == api.secret()[TLS_CERT]
    from ix_gpu.webhook.service.server import ensure_certificates

    assert ensure_certificates(tmp_path) == (tmp_path / "tls.crt", tmp_path / "tls.key")


def test_a_renewal_keeps_the_owner_and_gives_an_ownerless_secret_one(tmp_path: Path) -> None:
    """A PUT replaces ownerReferences, so every replace carries the owner again; a Secret written
    by an older version (no owner) gains it at its next renewal."""
    api = StandIn()
    api.mwc_uid = None  # configuration not found when the Secret was created
    clock = Clock()
    manager = _manager(api, tmp_path, clock, validity=dt.timedelta(days=90))
    manager.ensure()
    key = f"{NAMESPACE}/webhook-tls"
    assert api.owners[key] is None
    api.mwc_uid = "mwc-uid-2"
    clock.now += dt.timedelta(days=65)
    manager.ensure()
    assert manager.events[-2:] == ["renewed", "wrote-cert"]
    assert api.owners[key] == Owner(MWC, "mwc-uid-2")
