"""Prometheus metrics of the device plugin, in a registry of their own.

A private registry (not the process-global default) lets tests and the benchmark run several
plugins in one process without "duplicated timeseries" errors.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ix_gpu.plugin.devices.device_state import HEALTHY, UNHEALTHY


class PluginMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.devices = Gauge(
            "ix_gpu_plugin_devices",
            "Devices advertised to the kubelet, by health",
            ["health"],
            registry=self.registry,
        )
        self.registrations = Counter(
            "ix_gpu_plugin_registrations",
            "Register calls to the kubelet, by result",
            ["result"],
            registry=self.registry,
        )
        self.allocations = Counter(
            "ix_gpu_plugin_allocations",
            "Allocate container requests, by result",
            ["result"],
            registry=self.registry,
        )
        self.allocate_seconds = Histogram(
            "ix_gpu_plugin_allocate_duration_seconds",
            "Time to answer one Allocate call",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1),
            registry=self.registry,
        )
        self.health_transitions = Counter(
            "ix_gpu_plugin_health_transitions",
            "Chip health transitions, by the state entered",
            ["to"],
            registry=self.registry,
        )
        self.backend_errors = Counter(
            "ix_gpu_plugin_backend_errors",
            "Health checks in which the management library failed",
            registry=self.registry,
        )
        self.config_reloads = Counter(
            "ix_gpu_plugin_config_reloads",
            "Config file changes seen, by result (success, error)",
            ["result"],
            registry=self.registry,
        )
        for health in (HEALTHY, UNHEALTHY):
            self.devices.labels(health=health).set(0)
