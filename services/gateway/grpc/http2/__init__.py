"""gRPC on the gateway's event loop, without grpc core's threads: an HTTP/2 server
(``connection.py``, ``frames.py``) whose streams are calls (``calls.py``) of servicers written
for ``grpc.aio`` (``server.py``). Decision 016 says why."""
