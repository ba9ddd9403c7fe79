"""The cluster's security pieces every process shares.

    credential   the cluster credential (secret file, derived keys) every internal channel uses
    grpc_auth    the gRPC interceptors that put the credential on calls and check it
    tls          reading the PEM files TLS flags name (one error type for every process)
"""
