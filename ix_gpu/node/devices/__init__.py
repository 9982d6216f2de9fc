"""The node's devices as both agents advertise them: chips grouped into boards and devices
(``flags.splitboard``, time-slicing replicas), their health with recovery hysteresis, and the CDI
spec a container runtime applies for them. Pure of gRPC, of the API server and of management
libraries: backends are seen only through :mod:`ix_gpu.node.backends.base`.
"""
