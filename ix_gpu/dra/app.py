"""The ``ix-gpu dra`` process: serve the DRA socket, then the registration socket, then publish.

Order matters as for the device plugin: the kubelet's plugin watcher calls GetInfo as soon as the
registration socket appears and dials the endpoint it names, so the DRA service is serving first.
The kubelet finds the registration socket again by itself after its own restart (it scans the
directory on start), so, unlike the device plugin, nothing here re-registers.

The health loop asks the backend for chips every ``health_interval`` seconds and republishes the
slice when anything changed; a backend that fails marks every known device unhealthy, with the
backend's message as the reason, as the device plugin does.

The health loop is supervised (:mod:`ix_gpu.process.supervision`): an unexpected exception is
logged with its traceback, counted (``loop_crashes``) and the loop restarted after a backoff,
while the sockets keep serving; shutdown runs whatever the loop did. A slice write that fails is
retried with backoff (1 s doubling to a minute, with jitter), not on every health interval.

The node's GPUs are this process's to hand out only on a node labelled
``ix-gpu.io/gpu.allocation=dra`` whose kubelet offers no device-plugin GPUs
(:mod:`ix_gpu.node.allocator`). Until then, and as soon as that stops being true, the
slice lists no device and Prepare refuses claims it has not prepared before; a claim prepared
earlier is still answered from the checkpoint (nothing new is handed out) and still unprepared.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grpclib.server import Server

from ix_gpu.devicemodel import labels
from ix_gpu.dra.checkpoint import Checkpoint
from ix_gpu.dra.claims import ClaimReader
from ix_gpu.dra.devices import DraDevice, UnhealthyMode, counter_sets, dra_devices, slice_devices
from ix_gpu.dra.health_stream import HealthReports, HealthV1alpha1Servicer, HealthV1Servicer
from ix_gpu.dra.metrics import DraMetrics, DraState, render_metrics
from ix_gpu.dra.prepare import Preparer
from ix_gpu.dra.servicer import DraServicer, RegistrationServicer
from ix_gpu.dra.slices import SlicePublisher
from ix_gpu.dra.sockets import dra_socket_name, newer_instance_serves, registration_socket_name, remove_stale
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.node.allocator import NodeFacts, Verdict, dra_verdict
from ix_gpu.node.backends.base import Backend, BackendError, Chip
from ix_gpu.node.gpu_reset import ChipResetter, ResetFailed
from ix_gpu.node.node_config import FIRST_ANSWER_WAIT, NodeLabelReader, choose, named_configs
from ix_gpu.process.backoff import Backoff
from ix_gpu.process.supervision import Supervised, supervise

if TYPE_CHECKING:
    from grpclib._typing import IServable

log = logging.getLogger(__name__)

MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL


@dataclass(frozen=True)
class DraSettings:
    driver: str
    node: str
    plugins_dir: Path
    """The kubelet's plugins directory; the DRA socket is ``<dir>/<driver>/dra.sock``."""
    registry_dir: Path
    cdi_dir: Path
    checkpoint: Path
    splitboard: bool
    driver_root: str | None = None
    unhealthy: UnhealthyMode = "taint"
    partitionable: bool = True
    """Publish boards and their chips with shared counters where the cluster serves them."""
    partitionable_shares: bool = False
    """With ``replicas`` above 1 too: every board and chip shared, keeping its counters. Off by
    default: a kube-scheduler before Kubernetes 1.37 may give a board's share and its chip's share
    together (module doc of :mod:`ix_gpu.dra.devices`)."""
    replicas: int = 1
    """``sharing.timeSlicing.replicas``: above 1, devices are shared in that many memory shares
    where the cluster serves consumable capacity."""
    health_interval: float = 5.0
    """How often the chips' health is read and the slice (and the allocation verdict, from the
    node's watch) brought up to date."""
    config_dir: Path | None = None
    """``--config DIR``: the directory of named configs one was picked from at start."""
    default_config: str | None = None
    config_label: str | None = None
    """The node's config label when the config was picked (None: none, or not readable)."""
    metrics_port: int | None = None
    """Port of /healthz and /metrics (None: not served)."""
    metrics_host: str = "::"
    """Where they listen; ``::``: both IP families (:func:`ix_gpu.serving.guarded_http.listen_socket`)."""
    reset_timeout: float | None = None
    """``flags.reset_gpu``: a new claim's chips are reset within this many seconds
    (``gpuReset.timeoutSeconds``) before it is prepared; None: no reset."""
    unregister_grace: float = 2.0
    """On stop, how long the DRA service outlives the registration socket (:meth:`DraApp.shutdown`)."""
    socket_id: str | None = None
    """``--socket-id``: sockets of this instance's own, for rolling updates (:mod:`ix_gpu.dra.sockets`)."""

    @property
    def dra_socket(self) -> Path:
        return self.plugins_dir / self.driver / dra_socket_name(self.socket_id)

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / registration_socket_name(self.driver, self.socket_id)

    def socket_problems(self) -> list[str]:
        return [
            f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes"
            for path in (self.dra_socket, self.registration_socket)
            if len(str(path).encode()) > MAX_SOCKET_PATH
        ]


class DraApp:
    def __init__(
        self,
        settings: DraSettings,
        backend: Backend,
        api: ApiServer,
        node_reader: NodeLabelReader | None = None,
    ) -> None:
        """``node_reader``: the one start-up read the node with (for its config label), if any."""
        self.settings = settings
        self.backend = backend
        self.devices: dict[str, DraDevice] = {}
        self._chips: list[Chip] = []
        self.publisher = SlicePublisher(api, driver=settings.driver, node=settings.node)
        self.node_reader = node_reader or NodeLabelReader(api, settings.node)
        self._config_label = settings.config_label
        self.allocation = Verdict(False, "this node's allocation label is not read yet")
        self.claims = ClaimReader(api)
        self.preparer = Preparer(
            driver=settings.driver,
            pool=settings.node,
            vendor=backend.vendor,
            cdi_dir=settings.cdi_dir,
            checkpoint=Checkpoint(settings.checkpoint),
            read_claim=self.claims.read,
            devices=lambda: self.devices,
            control_nodes=backend.control_nodes,
            driver_root=settings.driver_root,
            refusal=lambda: None if self.allocation.allowed else self.allocation.reason,
            reset=self._reset_chips if settings.reset_timeout is not None else None,
        )
        self.registration = RegistrationServicer(settings.driver, str(settings.dra_socket))
        self.metrics = DraMetrics()
        self.resetter = ChipResetter(backend, record=self.metrics.record_reset)
        self.http_server: asyncio.Server | None = None
        """/healthz and /metrics, while serving (``metrics_port``)."""
        self.health_reports = HealthReports(settings.node, settings.health_interval)
        self.stop = asyncio.Event()
        self._servers: list[tuple[Server, Path]] = []
        self._last_error = ""
        self.health_loop = Supervised("health loop")
        self.yielded_to: Path | None = None
        """The DRA socket of the newer instance that publishes the slices now, if any."""
        self.publish_retry = Backoff(first=1.0, cap=60.0)
        self.unhealthy: UnhealthyMode = settings.unhealthy
        """How unhealthy devices are published: ``--unhealthy``, until the apiserver is seen to
        drop device taints (then ``remove``)."""
        self.partitionable = settings.partitionable
        """Boards and their chips with shared counters (:mod:`ix_gpu.dra.devices`), until the
        apiserver is seen to drop the counters (then the plain layout)."""
        self.shares = settings.replicas
        """Memory shares per device, until the apiserver is seen to drop them (then 1)."""
        self.api_errors: collections.Counter[str] = collections.Counter()
        """Requests to the API server that failed, by call: ``node_read``, ``slice_write`` (the
        GET or the PUT/POST of the slice)."""
        self.node_reader.on_error = lambda _message: self.api_errors.update(("node_read",))

    async def _serve(self, handlers: list[IServable], path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket from a previous run would make bind fail
        server = Server(handlers)
        await server.start(path=str(path))
        self._servers.append((server, path))
        log.info("serving %s on %s", ", ".join(type(h).__name__ for h in handlers), path)

    def _reset_chips(self, chips: Sequence[Chip]) -> None:
        """Reset a claim's chips (blocking: prepare runs in a worker thread); the slice is brought
        up to date at once when a chip came back as another."""
        assert self.settings.reset_timeout is not None
        try:
            self.resetter.reset(chips, self.settings.reset_timeout)
        except ResetFailed:
            self.refresh()
            raise

    async def _refresh(self) -> None:
        """:meth:`refresh` in a worker thread, then its health to the kubelet's health streams."""
        await asyncio.to_thread(self.refresh)
        await self.health_reports.update(self.devices.values(), time.time())

    def refresh(self) -> None:
        """Discover chips once (blocking); a failing backend taints what was known."""
        try:
            self._chips = self.backend.chips()
        except BackendError as exc:
            self._chips = [dataclasses.replace(chip, unhealthy_reason=str(exc)) for chip in self._chips]
            self._note(f"backend {self.backend.name}: {exc}")
        self._layout()

    def _layout(self) -> None:
        found = dra_devices(
            self._chips,
            splitboard=self.settings.splitboard,
            partitionable=self.partitionable and (self.shares == 1 or self.settings.partitionable_shares),
            shares=self.shares,
        )
        self.devices = {d.name: d for d in found}

    def check_allocation(self) -> Verdict:
        """Decide from the node as last heard (its watch). Logged on change."""
        domain = self.backend.vendor.resource_name.partition("/")[0]
        facts = self.node_reader.facts()
        self._follow_config_label(facts)
        if facts is not None:
            self.publisher.follow_node(facts.uid)
        verdict = dra_verdict(facts, domain)
        if verdict.reason != self.allocation.reason:
            if verdict.allowed:
                log.info("publishing this node's GPUs: %s", verdict.reason)
            else:
                log.warning("publishing no devices and preparing no new claim: %s", verdict.reason)
        self.allocation = verdict
        return verdict

    def _follow_config_label(self, facts: NodeFacts | None) -> None:
        """With a config directory, warn (once per label value) when the node's config label comes
        to pick another config than the one in use: it applies on the next start (module doc of
        :mod:`ix_gpu.dra.cli`)."""
        directory = self.settings.config_dir
        if directory is None or facts is None:
            return
        label = facts.labels.get(labels.DEVICE_PLUGIN_CONFIG)
        if label == self._config_label:
            return
        self._config_label = label
        try:
            names = named_configs(directory)
        except OSError:
            return
        was = choose(names, self.settings.config_label, self.settings.default_config).name
        now = choose(names, label, self.settings.default_config)
        if now.name != was:
            log.warning(
                "this node's config label changed (%s): ix-gpu dra keeps config %r until it is restarted",
                now.reason if now.name is None else f"it picks {now.name!r}: {now.reason}",
                was,
            )

    def publish(self) -> bool:
        """The slice lists the devices while they are ours to hand out, else none: an existing
        slice is emptied (generation bumped), and none is created just to say nothing."""
        devices = slice_devices(
            self.devices.values(), self.backend.vendor, self.settings.driver, self.unhealthy
        )
        if not self.publish_retry.ready():
            return False
        try:
            if self.allocation.allowed:
                changed = self.publisher.publish(devices, counter_sets(self.devices.values()))
            else:
                changed = self.publisher.publish([], create=False)
        except OSError as exc:  # every error of the API client is an OSError
            delay = self.publish_retry.failed()
            self.api_errors["slice_write"] += 1
            name = self.publisher.name
            self._note(f"cannot publish ResourceSlice {name} (retrying in {delay:.0f}s): {exc}", key=str(exc))
            return False
        self.publish_retry.succeeded()
        self._last_error = ""
        if self.publisher.taints_dropped and self.unhealthy == "taint":
            log.warning(
                "the API server dropped the device taints of ResourceSlice %s (its DRADeviceTaints feature "
                "is off; on by default from Kubernetes 1.36): an unhealthy device would stay allocatable, "
                "so unhealthy devices leave the slice instead, as with --unhealthy remove",
                self.publisher.name,
            )
            self.unhealthy = "remove"
            return self.publish() or changed
        if self.publisher.shares_dropped and self.shares > 1:
            log.warning(
                "the API server dropped allowMultipleAllocations from this node's ResourceSlice (its "
                "DRAConsumableCapacity feature is off; on by default from Kubernetes 1.36): each device "
                "goes to one claim at a time, and sharing.timeSlicing.replicas=%d does not apply (pods "
                "share a GPU by sharing one ResourceClaim)",
                self.shares,
            )
            self.shares = 1
            self._layout()
            return self.publish() or changed
        if self.publisher.counters_dropped and self.partitionable:
            log.warning(
                "the API server dropped the shared counters of this node's ResourceSlices (its "
                "DRAPartitionableDevices feature is off; on by default from Kubernetes 1.36): a board "
                "would be allocatable together with its own chips, so each %s is published alone, as "
                "splitboard says, and a claim cannot pick boards or chips",
                "chip" if self.settings.splitboard else "board",
            )
            self.partitionable = False
            self._layout()
            return self.publish() or changed
        return changed

    def _publish_unless_newer_serves(self) -> None:
        """:meth:`publish`, unless an instance started after this one serves (a rolling update):
        the slices are then that one's to write (:mod:`ix_gpu.dra.sockets`). What this instance
        published is forgotten, so that it compares with what is stored should it publish again."""
        newer = newer_instance_serves(self.settings.dra_socket)
        if newer is None:
            if self.yielded_to is not None:
                log.info("%s serves no more: publishing this node's slices again", self.yielded_to)
                self.yielded_to = None
            self.publish()
        elif newer != self.yielded_to:
            log.info("a newer instance of this plugin serves on %s: it publishes this node's slices", newer)
            self.yielded_to = newer
            self.publisher.forget()

    # -- /healthz and /metrics ---------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Why /healthz fails: only a health loop waiting to restart after a crash. Not being
        registered is not one: the kubelet registers a DRA driver when it finds the registration
        socket (and again after its own restart), so restarting this pod would not help, and on a
        kubelet without DRA it would loop forever; ``ix_gpu_dra_registered`` alerts instead."""
        loop = self.health_loop
        return (
            [f"the {loop.name} failed ({loop.last_error}) and is waiting to restart"]
            if loop.restarting
            else []
        )

    def not_ready(self) -> list[str]:
        """Why ``/readyz`` fails: the kubelet has not registered the driver yet."""
        return [] if self.registration.registered else ["not registered with the kubelet"]

    def notes(self) -> list[str]:
        """What /healthz adds to a 200: not registered, not publishing and why, and API reads or
        slice writes that fail now (the node keeps what it last heard and published)."""
        out = []
        if not self.registration.registered:
            error = self.registration.last_error
            out.append(f"not registered with the kubelet{': ' + error if error else ''}")
        if not self.allocation.allowed:
            out.append(f"not publishing devices: {self.allocation.reason}")
        if (problem := self.node_reader.problem()) is not None:
            out.append(problem)
        if self._last_error:
            out.append(f"last failure: {self._last_error}")
        return out

    def metrics_text(self) -> bytes:
        devices = list(self.devices.values())
        healthy = sum(device.healthy for device in devices)
        state = DraState(
            registered=self.registration.registered,
            publishing=self.allocation.allowed,
            devices={"Healthy": healthy, "Unhealthy": len(devices) - healthy},
            api_errors=dict(self.api_errors),
            loop_crashes=self.health_loop.crashes,
        )
        return render_metrics(self.metrics, state)

    def _note(self, message: str, *, key: str | None = None) -> None:
        """One log line per distinct failure (``key``, else the message), not one per attempt."""
        key = message if key is None else key
        if key != self._last_error:
            log.warning("%s", message)
            self._last_error = key

    async def _health_loop(self) -> None:
        while not self.stop.is_set():
            await self._refresh()
            await asyncio.to_thread(self.check_allocation)
            await asyncio.to_thread(self._publish_unless_newer_serves)
            await asyncio.to_thread(self.claims.close_idle)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.settings.health_interval)

    async def run(self, *, handle_signals: bool = False) -> int:
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop.set)
        await self._refresh()  # devices known before the first Prepare can come
        self.node_reader.start()
        await asyncio.to_thread(self.node_reader.wait_synced, FIRST_ANSWER_WAIT)
        await asyncio.to_thread(self.check_allocation)  # and whether new claims may be prepared
        if self.settings.metrics_port is not None:
            from ix_gpu.serving.agent_http import address_text, start_http_server

            host, port = self.settings.metrics_host, self.settings.metrics_port
            try:
                self.http_server = await start_http_server(self, host, port)
            except OSError as exc:  # in use, or not an address of this host: say which, once
                where = address_text(host, port)
                log.error("cannot serve /healthz and /metrics on %s: %s", where, exc.strerror or exc)
                await asyncio.to_thread(self.node_reader.stop)
                self.backend.close()
                return 1
        node_service: list[IServable] = [
            DraServicer(self.preparer, self.metrics),
            HealthV1Servicer(self.health_reports),
            HealthV1alpha1Servicer(self.health_reports),
        ]
        dra_socket, registration_socket = self.settings.dra_socket, self.settings.registration_socket
        await asyncio.to_thread(remove_stale, dra_socket, registration_socket, self.settings.driver)
        await self._serve(node_service, dra_socket)
        await self._serve([self.registration], registration_socket)
        health = asyncio.create_task(supervise(self._health_loop, self.health_loop, self.stop))
        try:
            await self.stop.wait()
        finally:
            health.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await health
            await self.shutdown()
            if self.http_server is not None:
                self.http_server.close()
            await asyncio.to_thread(self.node_reader.stop)
        return 0

    async def shutdown(self, grace: float = 1.0) -> None:
        """The registration socket first; the DRA service answers ``unregister_grace`` more, until
        the kubelet's plugin watcher has seen it gone: a call sent meanwhile is answered, not cut
        off (the kubelet retries only with the pod's next sync, 10 s and more later). Bounded."""
        for k, (server, path) in enumerate(reversed(self._servers)):
            if k == 1:  # the DRA service, after the registration socket
                await asyncio.sleep(self.settings.unregister_grace)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), timeout=grace)
        self._servers.clear()
        self.claims.close_idle(everything=True)
        self.backend.close()
