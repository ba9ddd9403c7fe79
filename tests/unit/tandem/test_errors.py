"""Status codes -> typed errors, and the retry-after trailer the router sends."""

from __future__ import annotations

import grpc
import pytest

from tandem.sdk.errors import (
    AuthError,
    Cancelled,
    DeadlineExceeded,
    Internal,
    InvalidRequest,
    NotFound,
    Overloaded,
    TandemError,
    Unavailable,
    from_rpc_error,
    from_status,
    retry_after_s,
)


@pytest.mark.parametrize(
    "code,cls",
    [
        ("INVALID_ARGUMENT", InvalidRequest),
        ("OUT_OF_RANGE", InvalidRequest),
        ("FAILED_PRECONDITION", InvalidRequest),
        ("RESOURCE_EXHAUSTED", Overloaded),
        ("UNAVAILABLE", Unavailable),
        ("DEADLINE_EXCEEDED", DeadlineExceeded),
        ("CANCELLED", Cancelled),
        ("UNAUTHENTICATED", AuthError),
        ("PERMISSION_DENIED", AuthError),
        ("NOT_FOUND", NotFound),
        ("INTERNAL", Internal),
        ("UNKNOWN", Internal),
        ("UNIMPLEMENTED", Internal),
        ("DATA_LOSS", Internal),
    ],
)
def test_each_code_maps_to_its_type(code: str, cls: type[TandemError]) -> None:
    err = from_status(code, "the details")
    assert type(err) is cls
    assert err.code == code and err.message == "the details"
    assert str(err) == f"{code}: the details"


def test_every_grpc_status_code_maps_to_a_tandem_error() -> None:
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        assert isinstance(from_status(code.name, "x"), TandemError)


def test_python_base_classes_let_generic_handlers_work() -> None:
    assert isinstance(from_status("INVALID_ARGUMENT", "x"), ValueError)
    assert isinstance(from_status("DEADLINE_EXCEEDED", "x"), TimeoutError)


@pytest.mark.parametrize(
    "metadata,expected",
    [
        ((("retry-after-ms", "250"),), 0.25),
        ((("other", "1"), ("retry-after-ms", b"1500")), 1.5),
        ((("retry-after-ms", "0"),), 0.0),
        ((("retry-after-ms", "soon"),), None),
        ((("retry-after-ms", "-5"),), None),
        ((("other", "1"),), None),
        ((), None),
        (None, None),
    ],
)
def test_retry_after_trailer(metadata, expected) -> None:
    assert retry_after_s(metadata) == expected


def test_overloaded_carries_retry_after_only_when_sent() -> None:
    with_info = from_status("RESOURCE_EXHAUSTED", "full", (("retry-after-ms", "200"),))
    without = from_status("RESOURCE_EXHAUSTED", "full", ())
    assert isinstance(with_info, Overloaded) and with_info.retry_after_s == 0.2
    assert isinstance(without, Overloaded) and without.retry_after_s is None


class _CallError(grpc.RpcError):
    """What a failed grpc call raises: an RpcError that is also a Call."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers=(), initial=None) -> None:
        self._code, self._details, self._trailers = code, details, trailers
        self._initial = initial

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):
        return self._trailers

    def initial_metadata(self):
        return self._initial  # None: the call ended before any header came


def test_from_rpc_error_reads_code_details_and_trailers() -> None:
    rpc = _CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", (("retry-after-ms", "40"),))
    err = from_rpc_error(rpc)
    assert isinstance(err, Overloaded) and err.retry_after_s == 0.04
    assert err.message == "queue full" and err.__cause__ is rpc


def test_a_bare_rpc_error_is_unavailable() -> None:
    assert isinstance(from_rpc_error(grpc.RpcError("boom")), Unavailable)


def test_a_failure_after_the_router_named_the_request_carries_its_id() -> None:
    """The id comes from the call's initial metadata (x-request-id), as the router sends it
    once it accepted the request, and shows in the message a log or a terminal prints."""
    rpc = _CallError(grpc.StatusCode.UNAVAILABLE, "no decode worker",
                     initial=(("content-type", "application/grpc"),
                              ("x-request-id", b"checkout-42")))
    err = from_rpc_error(rpc)
    assert isinstance(err, Unavailable) and err.request_id == "checkout-42"
    assert str(err) == "UNAVAILABLE: no decode worker (request_id=checkout-42)"


@pytest.mark.parametrize("initial", [None, ()])
def test_the_id_in_the_trailers_names_a_failure_whose_initial_metadata_was_missed(initial) -> None:
    """A grpc.aio stream failing at its first read may hold the status but not the headers
    the router sent before it: the router repeats the id in the trailers."""
    rpc = _CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, "router overloaded",
                     (("retry-after-ms", "200"), ("x-request-id", "sdk-busy-2")), initial)
    err = from_rpc_error(rpc)
    assert isinstance(err, Overloaded) and err.request_id == "sdk-busy-2"
    assert err.retry_after_s == 0.2


@pytest.mark.parametrize("initial", [None, (), (("other", "1"),)])
def test_a_failure_without_an_echoed_id_names_none(initial) -> None:
    err = from_rpc_error(_CallError(grpc.StatusCode.INVALID_ARGUMENT, "bad", initial=initial))
    assert err.request_id == "" and str(err) == "INVALID_ARGUMENT: bad"
    assert from_status("INTERNAL", "x").request_id == ""
