"""Generated protobuf/gRPC stubs for the kubelet's DRA node service (``dra_v1``) and its plugin
registration (``pluginregistration_v1``), from our own ``.proto`` text (``scripts/gen_proto.sh``).

As with :mod:`ix_gpu.plugin.api`: the ``*_pb2`` and ``*_grpc`` (grpclib) modules are what the
``ix-gpu dra`` process imports; the ``*_pb2_grpc`` (grpcio) modules are for the tests, which play
the kubelet with a second gRPC implementation.
"""
