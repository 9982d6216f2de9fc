"""The node: what both node agents (the device plugin and the DRA plugin) know about the GPUs of
the node they run on, below both and speaking neither kubelet API.

- :mod:`.backends`: discovery and health reads (ixml, nvml, devfs, fake) behind one interface.
- :mod:`.devices`: chips grouped into boards and devices (splitboard, time-slicing replicas),
  health with recovery hysteresis, and the CDI spec (device nodes, driver mount, linker-cache hook)
  a container runtime applies.
- :mod:`.agent`: the agents' common start-up: their shared flags, the config and its sharing plan,
  the backend, cluster access.
- :mod:`.config_loader`: the ix-config, validated in a child interpreter so pydantic never enters
  the long-running agent; :mod:`.fake_devices_file` does the same for the fake backend's file.
- :mod:`.allocator`: which of the two agents hands out a node's GPUs (the node's label).
- :mod:`.telemetry`, :mod:`.attribution`: per-chip figures and the pods holding each chip.
- :mod:`.node_config`: the node's own facts (its labels), watched, and the per-node config they choose.
- :mod:`.node_labels`: the ``ix-gpu.io/gpu.*`` labels published on the node.

The device plugin (:mod:`ix_gpu.plugin`) and the DRA plugin (:mod:`ix_gpu.dra`) each build on this
and never import each other. May import :mod:`ix_gpu.devicemodel`, :mod:`ix_gpu.config` and the
support packages (:mod:`ix_gpu.kube`, :mod:`ix_gpu.process`, :mod:`ix_gpu.serving`); never an
agent, the webhook or a gRPC library.
"""
