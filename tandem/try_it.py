"""``python -m tandem.try_it --target HOST:PORT "prompt"``: stream one chat reply from a router.

A minimal client over the generated stubs until the SDK and ``tandem generate`` land.
"""

from __future__ import annotations

import argparse
import sys

import grpc

from protos.tandem.v1 import tandem_pb2, tandem_pb2_grpc


def main(argv: list[str] | None = None) -> int:
    """Send one chat message and print the reply as it streams."""
    p = argparse.ArgumentParser(prog="python -m tandem.try_it")
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("prompt")
    args = p.parse_args(argv)
    chat = tandem_pb2.ChatMessages(messages=[tandem_pb2.ChatMessage(role="user", content=args.prompt)])
    req = tandem_pb2.GenerateRequest(
        chat=chat, sampling=tandem_pb2.SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    )
    try:
        with grpc.insecure_channel(args.target) as channel:
            for msg in tandem_pb2_grpc.TandemStub(channel).Generate(req, timeout=600):
                sys.stdout.write(msg.text)
                sys.stdout.flush()
                if msg.finished:
                    t = msg.timings
                    print(f"\n[{msg.finish_reason}; {msg.usage.completion_tokens} tokens; "
                          f"TTFT {t.first_token_s * 1e3:.0f} ms; total {t.total_s:.2f} s]")
    except grpc.RpcError as exc:
        print(f"\nerror: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
