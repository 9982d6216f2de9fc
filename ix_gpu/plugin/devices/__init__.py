"""What the plugin advertises and allocates: the resource-manager side of the plugin.

Builds the device list (boards, split chips, time-slicing replicas) from the chips a backend
reports, tracks health with recovery hysteresis, and answers allocation questions. Pure of gRPC and
of any management library: it sees backends only through :mod:`ix_gpu.plugin.backends.base`.
"""
