"""The pure mutation core: (object, namespace facts, config) -> (JSON patch ops, warnings, decision).

No I/O: nothing here reads files, talks to a cluster, opens sockets or knows HTTP. It may import
:mod:`ix_gpu.devicemodel`, :mod:`ix_gpu.config` and the standard library only (never fastapi,
uvicorn, kubernetes, grpc, socket, ssl, :mod:`ix_gpu.kube`, :mod:`ix_gpu.process` or
:mod:`ix_gpu.serving`); ``tests/test_layout.py`` enforces this. The service and the offline
``ix-gpu mutate`` run exactly this code.
"""
