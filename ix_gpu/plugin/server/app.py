"""The running plugin: discovery + health loop + config reload + registrar + metrics, and shutdown.

Everything here is driven by one asyncio loop in one process ("lightweight": no threads of ours).
The health loop is also where the config file and the fake devices file are re-read, by content,
because ConfigMap volumes update by symlink swap and send no useful file events.

The health loop and the registrar are supervised (:mod:`ix_gpu.process.supervision`): an
unexpected exception in either is logged with its traceback, counted in
``ix_gpu_plugin_loop_crashes_total`` and the loop restarted after a backoff; the process keeps its
kubelet connection meanwhile, and ``/healthz`` fails while a loop is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from ix_gpu.config.input_files import ConfigError
from ix_gpu.config.plugin_runtime import DeviceListStrategy, RuntimeConfig
from ix_gpu.node.attribution import holders_by_chip
from ix_gpu.node.backends.base import Backend, BackendError, Chip
from ix_gpu.node.devices.device_list import DeviceList, build_device_list
from ix_gpu.node.devices.health import HealthTracker
from ix_gpu.node.devices.sharing import SharingPlan, plan_sharing
from ix_gpu.node.gpu_reset import reset_problem
from ix_gpu.node.node_config import (
    FIRST_ANSWER_WAIT,
)
from ix_gpu.node.node_labels import NodeLabeler, node_labels
from ix_gpu.node.telemetry import Telemetry
from ix_gpu.plugin.offer.device_state import HEALTHY, UNHEALTHY, DeviceState, Snapshot
from ix_gpu.plugin.server.cdi_writer import CdiSpecWriter
from ix_gpu.plugin.server.config_follower import ConfigFollower
from ix_gpu.plugin.server.handout import ResetBeforeHandout
from ix_gpu.plugin.server.metrics import PluginMetrics, telemetry_lines
from ix_gpu.plugin.server.pod_resources import PodResourcesReader
from ix_gpu.plugin.server.registration import MAX_SOCKET_PATH, Registrar
from ix_gpu.plugin.server.servicer import DevicePluginServicer
from ix_gpu.plugin.server.settings import PluginSettings
from ix_gpu.plugin.server.volcano import VolcanoChoice
from ix_gpu.process.outcomes import ERROR
from ix_gpu.process.supervision import Supervised, supervise

log = logging.getLogger(__name__)

REGISTRATION_GRACE_SECONDS = 15.0

"""/healthz tolerates this long without registration: a kubelet restart takes a second or two."""


class PluginApp:
    def __init__(
        self,
        settings: PluginSettings,
        config: RuntimeConfig,
        backend: Backend,
        loaded_content: bytes | None = None,
        sharing: SharingPlan | None = None,
    ) -> None:
        """``loaded_content``: the config file's bytes that ``config`` came from, if the caller
        read them (a reload then starts only when the file changes); else the first health check
        reads and applies the file. ``sharing``: ``config``'s plan for ``backend``'s vendor, when
        the start-up made it already."""
        self.settings = settings
        self.config = config
        self.backend = backend
        self.sharing: SharingPlan = sharing or plan_sharing(config, backend.vendor.resource_name)
        """The config's sharing for this vendor: made once per config, read by everything here."""
        self.metrics = PluginMetrics()
        self.telemetry = (
            Telemetry(backend, settings.telemetry_interval) if settings.telemetry_interval > 0 else None
        )
        socket = settings.pod_resources_socket
        self.pod_resources = PodResourcesReader(socket) if socket is not None and self.telemetry else None
        self._device_chips: dict[str, tuple[str, ...]] = {}
        """Every device ID the config makes of the chips (offered or not) → its chips' UUIDs."""
        self.tracker = HealthTracker(config.recover_after)
        self.backend_error: str | None = None
        self.config_file = ConfigFollower(
            settings.config_path,
            loaded_content,
            directory=settings.config_dir,
            reader=settings.node_config,
            default=settings.default_config,
            record=lambda result: self.metrics.config_reloads.labels(result=result).inc(),
            overrides=settings.vendor_overrides,
        )
        self._chips: list[Chip] = []
        self.state = DeviceState(self._snapshot(build_device_list([], splitboard=False, replicas=1)))
        self.rediscover = asyncio.Event()
        """Set to run a health check now (a reset changed the chips), and at stop."""
        handout = ResetBeforeHandout(
            backend, self.metrics, lambda: self.config.reset_timeout_seconds, self.rediscover.set
        )
        self.volcano = VolcanoChoice(settings, self.metrics, lambda: self.resource_name)
        self.servicer = DevicePluginServicer(self.state, self.metrics, handout, self.volcano.choose)
        self.registrar = Registrar(
            settings.device_plugin_dir,
            self.servicer,
            self.metrics,
            lambda: self.resource_name,
            socket_id=settings.socket_id,
        )
        self.servicer.kubelet_left = self.registrar.kubelet_left
        self.labeler = NodeLabeler(
            settings.api_server, settings.node_name, on_error=self._api_error("label_write")
        )
        self.registrar.on_registered = self.labeler.forget
        if settings.node_config is not None:
            settings.node_config.on_error = self._api_error("node_read")
        if settings.allocation is not None:
            settings.allocation.reader.on_error = self._api_error("node_read")
            if settings.allocation.slices is not None:
                settings.allocation.slices.on_error = self._api_error("slice_list")
        self.loops = {name: Supervised(f"{name} loop") for name in ("health", "registration", "telemetry")}
        self._labels_warned = False
        self.cdi = CdiSpecWriter(backend)
        self.allocation_reason: str | None = None
        """Why the devices are advertised or not, as last decided (None: no gate)."""
        self.stop_event = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once the first discovery has been published (the benchmark and tests wait on it)."""

    def _api_error(self, call: str) -> Callable[[str], None]:
        counter = self.metrics.api_errors.labels(call=call)
        return lambda _message: counter.inc()

    @property
    def resource_name(self) -> str:
        return self.sharing.resource

    def check_socket_path(self) -> None:
        path = self.registrar.socket_path(self.resource_name)
        if len(str(path).encode()) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes; use a shorter directory"
            )

    def _snapshot(self, devices: DeviceList) -> Snapshot:
        unhealthy = {p.id: r for p in devices.physical if (r := self.tracker.device_reason(p))}
        return Snapshot(
            devices=devices,
            unhealthy=unhealthy,
            config=self.config,
            vendor=self.backend.vendor,
            control_nodes=self.backend.control_nodes(),
        )

    async def _reload_config(self) -> bool:
        """Apply a changed config file; the last good one stays when the new one is invalid."""
        config = await self.config_file.poll()
        if config is None or config.digest == self.config.digest:
            return False
        if problem := reset_problem(config, self.backend):
            log.error("config %s not applied: %s; keeping the one in use", self.config_file.path, problem)
            self.metrics.config_reloads.labels(result=ERROR).inc()
            return False
        old_resource = self.resource_name
        self.config = config
        self.volcano.follow(config)
        self.sharing = plan_sharing(config, self.backend.vendor.resource_name)
        self.tracker.recover_after = config.recover_after
        log.info(
            "config reloaded: splitboard=%s replicas=%d resourceName=%s",
            config.splitboard,
            self.sharing.replicas,
            self.resource_name,
        )
        for note in self.sharing.notes:
            log.warning("config %s: %s", self.config_file.path, note)
        if self.resource_name != old_resource:
            self.registrar.request_reregister()
        return True

    async def _poll_backend(self) -> None:
        # In a thread: the library is busy for the whole of a GPU reset (gpu_reset.SerializedBackend).
        try:
            chips = await asyncio.to_thread(self.backend.chips)
        except BackendError as exc:
            reason = f"management library error: {exc}"
            self.metrics.backend_errors.inc()
            if reason != self.backend_error:
                log.error("%s; advertising every device Unhealthy until it answers again", reason)
            self.backend_error = reason
            transitions = self.tracker.observe_failure(reason)
        else:
            if self.backend_error is not None:
                log.info("management library answers again (after: %s)", self.backend_error)
            self.backend_error = None
            transitions = self.tracker.observe(chips)
            self._chips = chips
        for t in transitions:
            (log.info if t.healthy else log.warning)("%s", t.describe())
            self.metrics.health_transitions.labels(to=HEALTHY if t.healthy else UNHEALTHY).inc()

    async def check_once(self) -> None:
        """One health interval's work: config, discovery/health, publish if anything changed."""
        await self._reload_config()
        await self._poll_backend()
        try:
            plan = self.sharing
            devices = build_device_list(
                self._chips,
                splitboard=self.config.splitboard,
                replicas=plan.replicas,
                shared=plan.devices,
                key=plan.key,
            )
        except ValueError as exc:
            log.error("cannot build the device list: %s", exc)
            return
        self._device_chips = {
            key: tuple(chip.uuid for chip in device.physical.chips)
            for device in devices.devices
            for key in (device.id, device.physical.id)
        }
        # The node labels still describe the node's GPUs when another allocator hands them out.
        allowed = await self._allowed()
        offered = devices if allowed else build_device_list([], splitboard=False, replicas=1)
        cdi = self.config.device_list_strategy is DeviceListStrategy.CDI
        if cdi and allowed and not await self.cdi.write(offered, self.config):
            return
        snapshot = self._snapshot(offered)
        if await self.state.publish(snapshot):
            healthy = sum(1 for d in offered.devices if snapshot.health(d) == HEALTHY)
            log.info(
                "advertising %d %s devices (%d Healthy, %d Unhealthy)",
                len(offered.devices),
                self.resource_name,
                healthy,
                len(offered.devices) - healthy,
            )
            self.metrics.devices.labels(health=HEALTHY).set(healthy)
            self.metrics.devices.labels(health=UNHEALTHY).set(len(offered.devices) - healthy)
        if self.config.labels_enabled:
            await self._label_node(devices)

    async def _allowed(self) -> bool:
        """Whether this node's GPUs are the device plugin's to advertise; an empty list (which the
        kubelet turns into allocatable 0) while they are not. Logged when the answer changes."""
        gate = self.settings.allocation
        if gate is None:
            return True
        verdict = await asyncio.to_thread(gate.verdict)
        if verdict.reason != self.allocation_reason:
            if verdict.allowed:
                log.info("advertising this node's GPUs: %s", verdict.reason)
            else:
                log.warning("advertising no devices: %s", verdict.reason)
            self.allocation_reason = verdict.reason
        return verdict.allowed

    async def _label_node(self, devices: DeviceList) -> None:
        if not self.labeler.usable:
            if not self._labels_warned:
                log.warning(
                    "labels.enabled, but not running in a cluster with NODE_NAME and a service account; "
                    "node labels are not published"
                )
                self._labels_warned = True
            return
        values = node_labels(devices)
        if self.labeler.pending(values):
            # urllib blocks; keep the event loop (and ListAndWatch) responsive meanwhile.
            await asyncio.to_thread(self.labeler.publish, values)

    async def _health_loop(self) -> None:
        while not self.stop_event.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.rediscover.wait(), timeout=self.config.health_interval_seconds)
            self.rediscover.clear()
            if not self.stop_event.is_set():
                await self.check_once()

    # -- liveness ------------------------------------------------------------------------------

    def not_ready(self) -> list[str]:
        """Why ``/readyz`` fails: not registered with the kubelet yet (a rolling update waits for
        the new pod's registration before it stops the old one)."""
        return [] if self.registrar.registered else ["not registered with the kubelet"]

    def problems(self) -> list[str]:
        """Why /healthz should fail; empty when healthy."""
        out = []
        if self.backend_error:
            out.append(self.backend_error)
        for loop in self.loops.values():
            if loop.restarting:
                out.append(f"the {loop.name} failed ({loop.last_error}) and is waiting to restart")
        if not self.registrar.registered:
            lost_for = time.monotonic() - self.registrar.not_registered_since
            if lost_for > REGISTRATION_GRACE_SECONDS:
                out.append(f"not registered with the kubelet for {lost_for:.0f}s")
        return out

    def notes(self) -> list[str]:
        """What ``/healthz`` adds to a 200: reads of the API server that fail now. They do not
        fail the probe: the node keeps what it read last, and a restart would only drop the
        kubelet's connection (every device Unhealthy) for an outage that is not this node's."""
        gate = self.settings.allocation
        out = gate.problems() if gate is not None else []
        reader = self.settings.node_config
        if reader is not None and (gate is None or reader is not gate.reader):
            out += [problem] if (problem := reader.problem()) is not None else []
        if self.labeler.error is not None:
            out.append(f"cannot label node {self.labeler.node}: {self.labeler.error}")
        return out + self.volcano.problems()

    # -- lifecycle -----------------------------------------------------------------------------

    def metrics_text(self) -> bytes:
        """``/metrics``: the plugin's own families, then the chips' telemetry."""
        return self.metrics.render(self.telemetry_lines())

    def telemetry_lines(self) -> Iterable[str]:
        """The chips' telemetry for ``/metrics`` (none when it is off or no chip is known)."""
        if self.telemetry is None or not self._chips:
            return ()
        node = self.settings.node_name or ""
        reader = self.pod_resources
        holders = (
            holders_by_chip(
                reader.containers,
                self._chips,
                resources=(self.resource_name,),
                device_chips=self._device_chips,
                dra_driver=self.settings.dra_driver,
                pool=node,
            )
            if reader is not None
            else {}
        )
        up = None if reader is None else reader.up
        return telemetry_lines(node, self.telemetry.collect(self._chips), holders, up)

    async def _telemetry_loop(self) -> None:
        """Every telemetry interval: start the chips' reads that are due (each in a short thread of
        its own, :mod:`ix_gpu.node.telemetry`) and read the kubelet's PodResources
        (:mod:`.pod_resources`). On this clock, not on scrapes: a chip's figures are then at most an
        interval old whatever the scrape interval, and "stale" means that the library did not
        answer, never that nobody scraped for a while (a scrape every 30 s with reads due every
        10 s would otherwise find every chip's last reading three intervals old)."""
        assert self.telemetry is not None
        while not self.stop_event.is_set():
            if self._chips:
                self.telemetry.collect(self._chips)
            if self.pod_resources is not None:
                await self.pod_resources.read()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), self.telemetry.interval)

    def request_stop(self, why: str) -> None:
        if not self.stop_event.is_set():
            log.info("%s: advertising all devices Unhealthy, then stopping", why)
            self.stop_event.set()
            self.rediscover.set()

    async def run(self, *, handle_signals: bool = False) -> int:
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
        watches = [w for w in (self.settings.node_config, self.settings.allocation) if w is not None]
        for watch in watches:
            watch.start()
        self.volcano.follow(self.config)
        # The first decision waits a moment for the first answers (a pod starting as the node joins
        # would otherwise see nothing offered for a health interval); without them, nothing is.
        await asyncio.to_thread(lambda: all(w.wait_synced(FIRST_ANSWER_WAIT) for w in watches))
        await self.check_once()
        self.ready.set()
        http_server = None
        if self.settings.metrics_port is not None:
            from ix_gpu.serving.agent_http import address_text, start_http_server

            address = address_text(self.settings.metrics_host, self.settings.metrics_port)
            try:
                http_server = await start_http_server(
                    self, self.settings.metrics_host, self.settings.metrics_port
                )
            except OSError as exc:  # in use, or not an address of this host: say which, once
                log.error("cannot serve /healthz and /metrics on %s: %s", address, exc.strerror or exc)
                if handle_signals:
                    for sig in (signal.SIGTERM, signal.SIGINT):
                        loop.remove_signal_handler(sig)
                return 1
        crashed = self._loop_crashed
        registrar = asyncio.create_task(
            supervise(
                lambda: self.registrar.run(self.stop_event),
                self.loops["registration"],
                self.stop_event,
                on_crash=crashed,
            ),
            name="registrar",
        )
        health = asyncio.create_task(
            supervise(self._health_loop, self.loops["health"], self.stop_event, on_crash=crashed),
            name="health",
        )
        tasks = [registrar, health]
        if self.telemetry is not None:
            telemetry = supervise(
                self._telemetry_loop, self.loops["telemetry"], self.stop_event, on_crash=crashed
            )
            tasks.append(asyncio.create_task(telemetry, name="telemetry"))
        try:
            await self.stop_event.wait()
        finally:
            await self._shutdown(*tasks)
            if http_server is not None:
                http_server.close()
                await http_server.wait_closed()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        return 0

    def _loop_crashed(self, name: str) -> None:
        self.metrics.loop_crashes.labels(loop=name.removesuffix(" loop")).inc()

    async def _shutdown(self, *tasks: asyncio.Task[None]) -> None:
        self.stop_event.set()
        # The farewell (every device Unhealthy) tells the kubelet not to admit GPU pods on a plugin
        # that is going; when another instance serves (a rolling update), it would empty the node
        # under that one instead (:mod:`.plugin_sockets`).
        if (other := await asyncio.to_thread(self.registrar.sibling_serving)) is None:
            await self.state.publish(replace(self.state.snapshot, final=True))
        else:
            log.info("another instance serves on %s: stopping without marking the devices Unhealthy", other)
        await self.state.close()
        if not await self.state.wait_streams_done(timeout=1.0):
            log.warning("ListAndWatch streams did not finish in 1s; stopping anyway")
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.registrar.shutdown(grace=1.0)
        for watch in (self.settings.node_config, self.settings.allocation, self.volcano):
            if watch is not None:
                await asyncio.to_thread(watch.stop)
        self.backend.close()
        log.info("stopped; socket removed")
