"""The plugin process: gRPC serving, kubelet registration and everything that runs on its loop.

The servicer adapts protobuf to :mod:`ix_gpu.plugin.offer`; the registrar serves before it
registers and re-registers when the kubelet restarts; ``app`` wires the backend, health loop, node
labels and HTTP endpoint together. Nothing here knows libixml or NVML.

Light on purpose, since it runs on every GPU node: gRPC is grpclib (asyncio over h2) and the
metrics text is written by hand; grpcio and prometheus_client are never imported here.
"""
