"""bench/vs_llama_cpp: the HTTP client both servers share, llama.cpp's output parsing, the
binary lookup and the report, all against fakes (no llama.cpp, no model)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from aiohttp import web

from bench.vs_llama_cpp import binaries as llama_cpp
from bench.vs_llama_cpp.binaries import LlamaCpp
from bench.vs_llama_cpp.compare import _row
from bench.vs_llama_cpp.report import markdown, plot, table
from bench.vs_llama_cpp.theirs import LlamaCppError, batched_bench, llama_bench
from tandem.loadgen.load import run_openai
from tandem.loadgen.workload import RequestSpec


def _sse_app(seen: list[dict]) -> web.Application:
    """/v1/completions streaming one chunk per token (one empty, as held-back text), then a
    usage chunk and [DONE]; a prompt of token id 0 gets a 400; one of token id 1 fails after
    its first token with an error event (as our server reports a failure once the headers
    are out)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if body["prompt"][0] == 0:
            return web.json_response({"error": {"message": "bad prompt"}}, status=400)
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        n = body["max_tokens"]
        if body["prompt"][0] == 1:
            chunk = {"choices": [{"index": 0, "text": "t0", "finish_reason": None}]}
            error = {"error": {"message": "worker lost", "type": "server_error", "code": 503}}
            await reply.write(f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(error)}\n\n"
                              "data: [DONE]\n\n".encode())
            return reply
        for i in range(n):
            text = "" if i == 1 else f"t{i}"
            finish = "length" if i == n - 1 else None
            chunk = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
            await reply.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.002)
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                          "completion_tokens": n}}
        await reply.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return reply

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


async def _serve_and_load(specs: list[RequestSpec], seen: list[dict]):
    runner = web.AppRunner(_sse_app(seen))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        return await run_openai(f"http://127.0.0.1:{port}", specs, timeout_s=30)
    finally:
        await runner.cleanup()


def test_openai_client_streams_fixed_length_greedy_requests() -> None:
    seen: list[dict] = []
    specs = [RequestSpec(i, 0.0, "bench", (5 + i, 6, 7), 6) for i in range(3)]
    specs.append(RequestSpec(3, 0.0, "bench", (0, 1), 4))
    specs.append(RequestSpec(4, 0.0, "bench", (1, 2), 4))
    results, wall = asyncio.run(_serve_and_load(specs, seen))
    assert wall > 0 and [r.index for r in results] == [0, 1, 2, 3, 4]
    for r in results[:3]:
        assert r.ok and r.output_tokens == 6  # the server's usage, not the 5 non-empty chunks
        assert len(r.token_times) == 5 and 0 < r.ttft <= r.e2e
        assert r.tpot == pytest.approx((r.e2e - r.ttft) / 5)
    assert not results[3].ok and results[3].error.startswith("HTTP 400")
    assert not results[4].ok and results[4].error == "error event: worker lost"
    body = next(b for b in seen if b["prompt"] == [5, 6, 7])
    assert body["ignore_eos"] is True and body["temperature"] == 0.0 and body["stream"] is True
    assert body["max_tokens"] == 6 and "model" not in body


def _fake_binary(path: Path, stdout: str) -> Path:
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\n")
    path.chmod(0o755)
    return path


def _fake_llama_cpp(tmp_path: Path, bench_out: str = "", batched_out: str = "") -> LlamaCpp:
    outs = {"llama-server": "", "llama-bench": bench_out, "llama-batched-bench": batched_out}
    return LlamaCpp({name: _fake_binary(tmp_path / name, out) for name, out in outs.items()},
                    str(tmp_path))


def test_llama_bench_rows_are_medians_of_samples(tmp_path: Path) -> None:
    tests = [
        {"n_prompt": 512, "n_gen": 0, "avg_ts": 200.0, "samples_ts": [100.0, 300.0, 310.0]},
        {"n_prompt": 0, "n_gen": 128, "avg_ts": 50.0, "samples_ts": [40.0, 50.0, 90.0]},
    ]
    lc = _fake_llama_cpp(tmp_path, bench_out="log line\n" + json.dumps(tests))
    row = llama_bench(lc, tmp_path / "m.gguf", 2, 512, 128, 3)
    assert row == {"pp_tok_s": 300.0, "tg_tok_s": 50.0, "tg_ms_per_tok": 20.0}
    with pytest.raises(LlamaCppError):
        llama_bench(lc, tmp_path / "m.gguf", 2, 256, 128, 3)  # no pp256 row


def test_batched_bench_reads_jsonl_and_takes_medians(tmp_path: Path) -> None:
    lines = [json.dumps({"pl": 32, "speed_tg": s, "speed_pp": 2 * s}) for s in (10.0, 30.0, 20.0)]
    lc = _fake_llama_cpp(tmp_path, batched_out="\n".join(["| md table |", *lines]))
    assert batched_bench(lc, tmp_path / "m.gguf", 2, 128, 128, 32, 3) == {
        "tok_s": 20.0, "pp_tok_s": 40.0}


def test_find_takes_the_env_dir_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_llama_cpp(tmp_path)
    monkeypatch.setenv("LLAMA_CPP_BIN_DIR", str(tmp_path))
    found = llama_cpp.find(lambda _: None)
    assert found is not None and found.server == tmp_path / "llama-server"
    os.unlink(tmp_path / "llama-bench")
    monkeypatch.setattr(llama_cpp, "BUILD_DIR", tmp_path / "none")
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    notes: list[str] = []
    assert llama_cpp.find_or_build(False, notes.append) is None
    assert any("lacks" in n for n in notes) and any("--build" in n for n in notes)


def test_llama_cpp_gets_the_cpus_vector_extensions_and_never_amx() -> None:
    """AMX listed by CPUID but unusable crashed llama-bench here: the build names each vector
    extension from /proc/cpuinfo instead of -march=native, and AMX is off."""
    spr = {"avx", "avx2", "bmi2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
           "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}
    flags = llama_cpp.isa_flags(spr)
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_AVX512=ON" in flags
    assert "-DGGML_AVX512_VNNI=ON" in flags and "-DGGML_AVX512_VBMI=OFF" in flags
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(flags)
    zen3 = {"avx", "avx2", "bmi2", "fma", "f16c"}
    assert "-DGGML_AVX512=OFF" in llama_cpp.isa_flags(zen3)
    assert "-DGGML_AVX2=ON" in llama_cpp.isa_flags(zen3)


def test_rows_ratios_and_report(tmp_path: Path) -> None:
    rows = [
        _row("decode", "decode", 1e3 / 8.0, 1e3 / 10.0, 8.0, 10.0),  # 1.25x: under 1.3x
        _row("prefill", "prefill", 900.0, 300.0),  # 3x: met
        _row("batched", "batched", 100.0, None),  # llama.cpp did not run
    ]
    assert rows[0]["ratio"] == pytest.approx(1.25) and rows[2]["ratio"] is None
    text = table(rows)
    assert "8.00 ms/tok" in text and "MISS" in text and " ok" in text
    results = {
        "command": "python -m bench.vs_llama_cpp.compare --quick", "threads": 2, "gguf": "m.gguf",
        "machine": {"cpu": "cpu", "cores": 2, "memory_gb": 8.0, "python": "3", "torch": "2",
                    "commit": "abc"},
        "llama_cpp": None, "plan": {}, "rows": rows, "notes": ["a note"],
    }
    md = markdown(results)
    assert "| prefill | 900.0 tok/s | 300.0 tok/s | 3.00x (met) | 2.0x |" in md
    assert "- a note" in md
    plot(results, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 1000
