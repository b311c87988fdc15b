"""The gRPC front: KServe v2 (Triton) over the same core, on the loop-native HTTP/2 server in
``http2/``."""
