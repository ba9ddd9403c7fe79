"""What a Generate call sends besides its request: the API key, and the caller's request id
as ``x-request-id`` metadata when gRPC metadata can carry it."""

from __future__ import annotations

import pytest

from tandem.common.wire import REQUEST_ID_KEY
from tandem.sdk._channel import call_metadata, generate_metadata
from tandem.sdk.client_config import ClientConfig

KEYED = call_metadata(ClientConfig(api_key="sk-1"))


def test_a_named_request_adds_its_id_after_the_key() -> None:
    assert REQUEST_ID_KEY == "x-request-id"
    assert generate_metadata(KEYED, "job-7/a") == (("authorization", "Bearer sk-1"),
                                                   ("x-request-id", "job-7/a"))
    assert generate_metadata((), "req_1") == (("x-request-id", "req_1"),)


@pytest.mark.parametrize("request_id", ["", "two words", "caf\u00e9", "tab\there", "nl\n"])
def test_no_id_or_one_metadata_cannot_carry_adds_nothing(request_id: str) -> None:
    """Those travel in the request field alone: the router refuses a malformed id there with
    INVALID_ARGUMENT (tests/integration/test_sdk.py), never a local gRPC error."""
    assert generate_metadata(KEYED, request_id) == KEYED
