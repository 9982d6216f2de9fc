"""What the device plugin hands out: Allocate's answer (device specs or CDI names, the
visible-devices variable, replica policy) and the advertised list's state between health changes.

Built on :mod:`ix_gpu.node.devices`. Pure of gRPC and of any management library.
"""
