"""Generated protobuf/gRPC stubs for the kubelet device-plugin API v1beta1 (``scripts/gen_proto.sh``).

The ``.proto`` is our own text written from the API's documented messages; the stubs are committed
so that running the plugin needs no protoc. ``deviceplugin_v1beta1_pb2`` holds the messages and
``deviceplugin_v1beta1_grpc`` the grpclib service bases and stubs: the plugin process
(:mod:`ix_gpu.plugin.server`) imports only these two. ``deviceplugin_v1beta1_pb2_grpc`` holds
grpcio stubs, for the tests and the benchmark that play the kubelet with a second gRPC
implementation; the plugin process never imports grpcio.
"""
