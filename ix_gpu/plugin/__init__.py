"""The device plugin (kubelet device-plugin API v1beta1).

- :mod:`ix_gpu.plugin.backends`: discovery backends (ixml, nvml, devfs, fake) behind one interface.
- :mod:`ix_gpu.plugin.devices`: what the plugin advertises and hands out (device list, replicas,
  allocation, health), built from what a backend reports; no gRPC, no management library.
- :mod:`ix_gpu.plugin.server`: the gRPC servicer, kubelet registration, the process lifecycle,
  node labels and the HTTP health/metrics endpoint.
- :mod:`ix_gpu.plugin.api`: the generated v1beta1 stubs and their ``.proto``.

May import :mod:`ix_gpu.devicemodel`, :mod:`ix_gpu.config` and :mod:`ix_gpu.runtime`; never
:mod:`ix_gpu.webhook`.
"""
