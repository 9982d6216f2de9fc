"""Self-managed certificates (the chart's default ``certs.mode: self``).

Nothing is generated at template time — ``genCA`` in a chart gives a new CA on every render, which
GitOps tools render constantly. Instead the webhook process, at start:

1. reads its Secret; when absent, creates it with a new CA and serving certificate. Create is
   create-if-absent and every update carries the resourceVersion it read, so replicas starting
   together converge on whichever write won: a loser re-reads and adopts it;
2. patches the caBundle of its own MutatingWebhookConfiguration when it differs;
3. writes ``tls.crt``/``tls.key`` into ``--cert-dir``, where the service's reloader picks them up.

It then re-checks periodically. A serving certificate with less than a third of its validity left
(or whose SANs no longer match) is re-issued from the same CA, so the caBundle does not change and
webhooks in flight never see an unknown issuer. Only when the CA itself would expire first is a
new CA made; the caBundle then holds the new and the old CA (``ca-bundle.crt``) and is patched
*before* a certificate from the new CA is written for the server to load.

The Secret is owned by that MutatingWebhookConfiguration (an ownerReference, written with every
create and replace), so deleting the configuration (``helm uninstall``) lets the garbage collector
delete the Secret too, and a later install starts with a new CA instead of a stale one.

The Secret keys: ``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key`` (type kubernetes.io/tls) and
``ca-bundle.crt``. The kubernetes client is reached through :class:`ClusterApi`, so the logic is
tested against a local stand-in and the adapter (:mod:`.self_cert_client`) against a real
apiserver. The material is :mod:`.self_cert_material`; the flags are :mod:`.self_cert_cli`.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ix_gpu.config.text import one_line
from ix_gpu.webhook.certs.self_mode_material import (
    CA_BUNDLE,
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    SecretMaterial,
    SelfCertError,
    issue_from_ca,
    load_cert,
    new_ca,
    split_pems,
    utc_now,
    write_pair,
)

log = logging.getLogger("ix_gpu.self_certs")


@dataclass(frozen=True)
class Owner:
    """The MutatingWebhookConfiguration the Secret belongs to (an ownerReference)."""

    name: str
    uid: str
    api_version: str = "admissionregistration.k8s.io/v1"
    kind: str = "MutatingWebhookConfiguration"


@dataclass(frozen=True)
class StoredSecret:
    data: dict[str, bytes]
    resource_version: str


class ClusterApi(Protocol):
    """The calls self mode makes — exactly what the chart's RBAC grants."""

    def read_secret(self, namespace: str, name: str) -> StoredSecret | None: ...

    def create_secret(self, namespace: str, name: str, data: dict[str, bytes], owner: Owner | None) -> bool:
        """False when the Secret already exists (another replica was first)."""
        ...

    def replace_secret(
        self, namespace: str, name: str, data: dict[str, bytes], resource_version: str, owner: Owner | None
    ) -> bool:
        """False on a resourceVersion conflict (another replica wrote in between)."""
        ...

    def configuration_uid(self, configuration: str) -> str | None:
        """The configuration's uid; None when it does not exist."""
        ...

    def read_ca_bundles(self, configuration: str) -> list[tuple[str, bytes | None]]:
        """(webhook name, decoded caBundle or None) for each webhook of the configuration."""
        ...

    def patch_ca_bundles(self, configuration: str, patch: list[dict[str, Any]]) -> None: ...


@dataclass(frozen=True)
class SelfCertSettings:
    namespace: str
    secret_name: str
    webhook_configuration: str
    dns_names: tuple[str, ...]
    cert_dir: Path
    validity: dt.timedelta = dt.timedelta(days=90)
    ca_validity: dt.timedelta = dt.timedelta(days=3650)
    renew_fraction: float = 1 / 3
    """Renew when less than this fraction of the serving certificate's validity is left."""
    check_interval: float = 600.0


@dataclass
class SelfCertManager:
    settings: SelfCertSettings
    api: ClusterApi
    clock: Callable[[], dt.datetime] = utc_now
    served: bytes | None = field(default=None, init=False)
    """The tls.crt last written to the cert dir."""
    events: list[str] = field(default_factory=list, init=False)
    """What this manager did, in order (for logs and tests): created, renewed, rotated-ca,
    adopted, patched-ca-bundle, wrote-cert."""

    # ---------------------------------------------------------------- decisions

    def _issue(self, ca_cert: bytes, ca_key: bytes) -> tuple[bytes, bytes]:
        return issue_from_ca(ca_cert, ca_key, self.settings.dns_names, self.clock(), self.settings.validity)

    def _new_material(self, previous_bundle: bytes = b"") -> SecretMaterial:
        ca_cert, ca_key = new_ca(self.clock(), self.settings.ca_validity)
        cert, key = self._issue(ca_cert, ca_key)
        # Keep CAs that still verify certificates in flight, so replicas still serving one of them
        # are trusted until they pick up the new certificate.
        still_valid = [pem for pem in split_pems(previous_bundle) if self._not_expired(pem)]
        return SecretMaterial(ca_cert, ca_key, ca_cert + b"".join(still_valid), cert, key)

    def _not_expired(self, pem: bytes) -> bool:
        try:
            return load_cert(pem).not_valid_after_utc > self.clock()
        except ValueError:
            return False

    def _needs_new_ca(self, material: SecretMaterial) -> str | None:
        from cryptography.hazmat.primitives import serialization

        try:
            ca = load_cert(material.ca_cert)
            ca_key = serialization.load_pem_private_key(material.ca_key, password=None)
        except (ValueError, TypeError) as exc:
            return f"unreadable CA: {exc}"
        if ca.public_key() != ca_key.public_key():
            return "ca.key does not belong to ca.crt"
        if ca.not_valid_after_utc < self.clock() + self.settings.validity:
            return "the CA expires before a new serving certificate would"
        return None

    def _needs_new_cert(self, material: SecretMaterial) -> str | None:
        from cryptography import x509
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization

        try:
            cert = load_cert(material.cert)
            key = serialization.load_pem_private_key(material.key, password=None)
            cert.verify_directly_issued_by(load_cert(material.ca_cert))
        except (ValueError, TypeError, InvalidSignature) as exc:
            return f"serving certificate unusable: {exc}"
        if cert.public_key() != key.public_key():
            return "tls.key does not belong to tls.crt"
        try:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            names = set(sans.get_values_for_type(x509.DNSName))
        except x509.ExtensionNotFound:
            names = set()
        if not set(self.settings.dns_names) <= names:
            return f"serving certificate lacks DNS names {sorted(set(self.settings.dns_names) - names)}"
        left = cert.not_valid_after_utc - self.clock()
        total = cert.not_valid_after_utc - cert.not_valid_before_utc
        if left < total * self.settings.renew_fraction:
            return f"serving certificate expires in {left}"
        return None

    # ---------------------------------------------------------------- the loop body

    def ensure(self, attempts: int = 8) -> None:
        """Bring Secret, caBundle and cert dir in line; safe to call from every replica at once."""
        for _ in range(attempts):
            before = len(self.events)
            material = self._settle_secret()
            if material is not None:
                self._publish(material, wrote_secret=len(self.events) > before)
                return
        raise SelfCertError(
            f"Secret {self.settings.namespace}/{self.settings.secret_name}: still conflicting "
            f"after {attempts} attempts"
        )

    def _settle_secret(self) -> SecretMaterial | None:
        """The material in the Secret after at most one write of ours; None = lost a race, retry."""
        s = self.settings
        stored = self.api.read_secret(s.namespace, s.secret_name)
        if stored is None:
            material = self._new_material()
            if self.api.create_secret(s.namespace, s.secret_name, material.secret_data(), self._owner()):
                self._note("created", f"created Secret {s.namespace}/{s.secret_name} with a new CA")
                return material
            return None  # another replica created it first: adopt theirs on the next read
        data = stored.data
        missing = [key for key in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY) if not data.get(key)]
        if missing:
            reason: str | None = f"Secret lacks {missing}"
            material = self._new_material()
            event = "rotated-ca"
        else:
            material = SecretMaterial(
                data[CA_CERT],
                data[CA_KEY],
                data.get(CA_BUNDLE) or data[CA_CERT],
                data[TLS_CERT],
                data[TLS_KEY],
            )
            reason = self._needs_new_ca(material)
            if reason is not None:
                material = self._new_material(previous_bundle=material.ca_bundle)
                event = "rotated-ca"
            else:
                reason = self._needs_new_cert(material)
                if reason is None:
                    return material
                material.cert, material.key = self._issue(material.ca_cert, material.ca_key)
                event = "renewed"
        if not self.api.replace_secret(
            s.namespace, s.secret_name, material.secret_data(), stored.resource_version, self._owner()
        ):
            return None
        self._note(event, f"{event} the webhook certificate: {reason}")
        return material

    def _owner(self) -> Owner | None:
        """The Secret's owner, read before each write (an ownerless Secret of an older version
        gains it at its next renewal). A missing configuration leaves the Secret ownerless: the
        caBundle patch that follows then reports the real problem."""
        name = self.settings.webhook_configuration
        uid = self.api.configuration_uid(name)
        return None if uid is None else Owner(name, uid)

    def _publish(self, material: SecretMaterial, wrote_secret: bool) -> None:
        # Order matters: the apiserver must trust the CA before the server presents a certificate
        # signed by it.
        self._ensure_ca_bundle(material.ca_bundle)
        if material.cert != self.served:
            write_pair(self.settings.cert_dir, material.cert, material.key)
            if self.served is not None and not wrote_secret:
                self._note("adopted", "serving a new certificate another replica wrote to the Secret")
            self.served = material.cert
            self.events.append("wrote-cert")

    def _ensure_ca_bundle(self, bundle: bytes) -> None:
        name = self.settings.webhook_configuration
        current = self.api.read_ca_bundles(name)
        if not current:
            raise SelfCertError(f"MutatingWebhookConfiguration {name} has no webhooks")
        encoded = base64.b64encode(bundle).decode()
        patch: list[dict[str, Any]] = []
        for index, (webhook, value) in enumerate(current):
            if value == bundle:
                continue
            # The test op pins the index to the webhook read: a concurrent reorder fails the whole
            # patch instead of writing a caBundle into the wrong entry.
            patch.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook})
            patch.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded})
        if patch:
            self.api.patch_ca_bundles(name, patch)
            self._note("patched-ca-bundle", f"patched the caBundle of {name}")

    def _note(self, event: str, message: str) -> None:
        self.events.append(event)
        log.info(
            message, extra={"fields": {"secret": f"{self.settings.namespace}/{self.settings.secret_name}"}}
        )

    # ---------------------------------------------------------------- background renewal

    def run_forever(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.wait(self.settings.check_interval if failures == 0 else min(300.0, 5.0 * 2**failures)):
            try:
                self.ensure()
                failures = 0
            except Exception as exc:  # API errors of every kind: keep serving, retry with backoff
                failures = min(failures + 1, 6)
                log.error(
                    "self certificates: check failed; still serving the current certificate",
                    extra={"fields": {"error": one_line(exc)}},
                )

    def start(self) -> threading.Event:
        stop = threading.Event()
        threading.Thread(target=self.run_forever, args=(stop,), name="self-certs", daemon=True).start()
        return stop
