"""The gateway's protocol-neutral core: the bus, one request's exchange on it, readiness,
admission, auth, the request context, errors, settings and metrics. Imports neither Litestar nor
grpc; the HTTP and gRPC fronts stand on it."""
