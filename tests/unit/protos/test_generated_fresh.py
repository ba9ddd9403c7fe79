"""The committed generated modules match what protoc makes of the .proto files today."""

from __future__ import annotations

from pathlib import Path

from scripts.gen_protos import PROTOS, ROOT, generate


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    generate(tmp_path)
    for proto in PROTOS:
        rel = proto.relative_to(ROOT).with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            fresh = (tmp_path / f"{rel}{suffix}").read_text()
            committed = (ROOT / f"{rel}{suffix}").read_text()
            assert fresh == committed, f"{rel}{suffix} is stale: run python scripts/gen_protos.py"


def test_generated_modules_import_by_proto_path() -> None:
    from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc

    req = worker_pb2.ReserveRequest(request_id="r", token_ids=[1, 2])
    req.sampling.CopyFrom(tandem_pb2.SamplingParams(max_tokens=4))
    assert worker_pb2.ReserveRequest.FromString(req.SerializeToString()) == req
    assert hasattr(worker_pb2_grpc, "DecodeServiceStub")
