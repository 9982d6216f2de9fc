"""The device plugin (kubelet device-plugin API v1beta1).

- :mod:`ix_gpu.plugin.offer`: what Allocate hands out and the advertised list's state, built on
  :mod:`ix_gpu.node`'s devices; no gRPC, no management library.
- :mod:`ix_gpu.plugin.server`: the gRPC servicer, kubelet registration, the process lifecycle, the
  DRA allocation gate and the HTTP health/metrics endpoint.
- :mod:`ix_gpu.plugin.api`: the generated v1beta1 stubs and their ``.proto``.

Builds on :mod:`ix_gpu.node` (backends, devices, CDI, node config and labels). May import
:mod:`ix_gpu.devicemodel`, :mod:`ix_gpu.config` and the support packages (:mod:`ix_gpu.kube`,
:mod:`ix_gpu.process`, :mod:`ix_gpu.serving`); never :mod:`ix_gpu.dra` or :mod:`ix_gpu.webhook`.
"""
