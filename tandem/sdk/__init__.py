"""The Python client of a Tandem router (``tandem.Client`` and friends, exported lazily by
``tandem/__init__.py``).

    client          ``Client``: blocking calls (generate, stream, chat ...)
    async_client    ``AsyncClient``: the asyncio twin, same methods awaited
    client_config   ``ClientConfig`` and ``TLSConfig``: the one configuration both take
    request_builder the router's request messages from keyword arguments (pure)
    sampling        ``SamplingOptions``: a request's sampling fields as one value
    results         typed results: plain dataclasses built from the router's replies
    errors          typed errors, mapped from the gRPC status codes the router returns
    retry           ``RetryPolicy``: jittered exponential backoff inside the call's deadline
    _channel        channels, credentials and call metadata both clients share

Imports tandem.protos, grpc and protobuf only (and the standard library): what the lean
tandem-client distribution ships.
"""
