"""Generated protobuf/gRPC stubs for the kubelet device-plugin API v1beta1 (``scripts/gen_proto.sh``).

The ``.proto`` is our own text written from the API's documented messages; the stubs are committed
so that running the plugin needs no protoc. Imported only by :mod:`ix_gpu.plugin.server`.
"""
