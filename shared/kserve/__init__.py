"""KServe v2 / Triton gRPC protocol (package ``inference``): protoc output, committed, never edited.

``grpc_service_pb2`` (messages), ``grpc_service_pb2_grpc`` (stub, servicer, registration) and
``model_config_pb2`` (Triton ``ModelConfig``) are generated from ``proto/shared/kserve/`` by
``make proto``. Import them by name; this package imports nothing, so that importing ``shared``
does not register the protocol with protobuf.

They register the ``inference.*`` names in protobuf's default descriptor pool, as
``tritonclient.grpc`` does, so one process cannot import both: run a stock client against our
server from a separate process.
"""
