"""The DRA kubelet plugin (``ix-gpu dra``): Dynamic Resource Allocation, ``resource.k8s.io/v1``.

It sits beside the device plugin, on the same node layer (:mod:`ix_gpu.node`):

- :mod:`.devices`: chips → the devices a ResourceSlice lists (names, attributes, capacity, taints);
  pure, no I/O.
- :mod:`.slices`: publishes this node's pool as a ResourceSlice, and again on every change.
- :mod:`.claims`, :mod:`.checkpoint`, :mod:`.prepare`: NodePrepareResources and
  NodeUnprepareResources: the claim's allocation read from the API server, a CDI spec per claim,
  the prepared claims kept on disk across restarts.
- :mod:`.servicer` (the DRA and registration services), :mod:`.app`: the gRPC side (grpclib) and the process.
- :mod:`.api`: our ``.proto`` text for the kubelet's APIs and the generated stubs.

May import :mod:`ix_gpu.devicemodel`, :mod:`ix_gpu.config`, the support packages
(:mod:`ix_gpu.kube`, :mod:`ix_gpu.process`, :mod:`ix_gpu.serving`) and :mod:`ix_gpu.node`
(backends, devices, CDI, node config, the common start-up); never :mod:`ix_gpu.plugin`, never
:mod:`ix_gpu.webhook`, and never a management library: chips come through a backend.
"""
