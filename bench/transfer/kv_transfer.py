"""KV transfer throughput and added latency (issue 3; results in docs/bench/kv_transfer.md).

    python -m bench.transfer.kv_transfer [--gib 1.0] [--out docs/bench]

Moves >= ``--gib`` GiB of SmolLM2-135M-shaped KV blocks (30 layers, 3 kv heads, head dim 64,
block size 16, bf16; 2,048-token requests of 128 blocks, block ids shuffled on both sides) from
this process to a receiver in a child process, and prints in the same run:

* raw socket ``sendall``/``recv_into`` on loopback (same socket options) -- the baseline,
* our TCP transport and our shm transport (checksums on, as in production; the sender and
  the receiver child are tandem/profiler/transfer_probe.py's, what ``tandem profile`` times),
* a single-threaded in-memory copy of the same number of bytes -- the ceiling,

then the latency a 2,048-token prompt's KV adds to its prefill when pushed layer by layer.
The layers run on a step thread, as the prefill worker's engine thread does, which hands each
finished layer to the event loop through a ``LoopDelivery`` (tandem/engine/loop_delivery.py:
the push then ships it while the thread computes the next, and the thread never waits for the
loop's turn to get the GIL back). Their compute is simulated with ``time.sleep`` (the CPU is idle
meanwhile, as when the compute runs on a GPU) at (a) the time one SmolLM2-shaped decoder layer
takes on this CPU over 2,048 tokens (random weights, measured here) and (b) stated GPU-like
times; ``--real-compute`` also runs that layer for real, competing for the CPUs.
``--layer-clock loop`` times the layers with ``asyncio.sleep`` on the event loop instead (the
method before): there epoll's millisecond timeouts round every wait that starts after the
push's work up to the next millisecond, which at 1 ms layers costs up to a layer per layer.

Rounds are interleaved (raw, tcp, shm, memcpy, repeat) and medians reported, because a shared
machine is noisy; each side's CPU time per GiB is recorded too, which noise affects far less.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tandem.engine.loop_delivery import LoopDelivery
from tandem.kv_transfer import Sender, SenderConfig
from tandem.kv_transfer.endpoint import Endpoint
from tandem.kv_transfer.transport import ShmTransport, TcpTransport
from tandem.profiler.transfer_probe import (
    BLOCKS_PER_REQ,
    LAYOUT,
    PROMPT_TOKENS,
    SETS,
    Child,
    Sample,
    block_sets,
    cpu_s,
    make_cache,
    new_secret,
    run_ours,
    say,
    start_receiver,
)

SOCK_BUF = 4 << 20
RAW_CHUNK = 16 << 20


# -- child process: the raw socket baseline (ours is tandem.profiler.transfer_probe's) -----------


def child_raw(nbytes: int) -> None:
    """Baseline receiver: recv_into one reused 256 MiB buffer until nbytes arrived, ack."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    buf = bytearray(256 << 20)
    view = memoryview(buf)
    say(json.dumps({"port": lsock.getsockname()[1]}))
    conn, _ = lsock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCK_BUF)
    cpu0 = cpu_s()
    got = 0
    while got < nbytes:
        at = got % len(buf)
        n = conn.recv_into(view[at:at + min(RAW_CHUNK, len(buf) - at, nbytes - got)])
        if n == 0:
            raise SystemExit("raw sender went away")
        got += n
    say(json.dumps({"cpu_s": cpu_s() - cpu0}))
    conn.sendall(b"k")
    conn.close()


# -- parent side -----------------------------------------------------------------------------------


async def run_raw(nbytes: int) -> Sample:
    """Baseline: blocking sendall of 16 MiB slices / recv_into, same socket options as ours."""
    child = await Child.start("bench.transfer.kv_transfer", "--child", "raw", str(nbytes))
    port = (await child.line())["port"]
    src = bytearray(256 << 20)
    memoryview(src)[:] = os.urandom(1 << 20) * 256
    view = memoryview(src)
    loop = asyncio.get_running_loop()

    def send() -> tuple[float, float]:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCK_BUF)
        cpu0, t0 = cpu_s(), time.perf_counter()
        sent = 0
        while sent < nbytes:
            at = sent % len(src)
            n = min(RAW_CHUNK, len(src) - at, nbytes - sent)
            sock.sendall(view[at:at + n])
            sent += n
        sock.recv(1)
        dt, cpu = time.perf_counter() - t0, cpu_s() - cpu0
        sock.close()
        return dt, cpu

    dt, tx_cpu = await loop.run_in_executor(None, send)
    rx_cpu = (await child.line())["cpu_s"]
    await child.finish()
    gib = nbytes / (1 << 30)
    return Sample(nbytes / dt / 1e9, tx_cpu / gib, rx_cpu / gib)


def run_memcpy(nbytes: int) -> Sample:
    """The ceiling: one thread copying 256 MiB buffers (numpy memcpy) until nbytes are moved."""
    src = torch.empty(256 << 20, dtype=torch.uint8).random_()
    dst = torch.zeros_like(src)
    s, d = memoryview(src.numpy()), memoryview(dst.numpy())
    reps = max(1, math.ceil(nbytes / (256 << 20)))
    cpu0, t0 = cpu_s(), time.perf_counter()
    for _ in range(reps):
        d[:] = s
    dt, cpu = time.perf_counter() - t0, cpu_s() - cpu0
    gib = reps * (256 << 20) / (1 << 30)
    return Sample(reps * (256 << 20) / dt / 1e9, cpu / gib, 0.0)


# -- latency ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class LayerSim:
    """A SmolLM2-shaped decoder layer (random weights, fp32) over a 2,048-token prompt."""

    hidden: int = 576
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    inter: int = 1536

    def make(self) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        def w(*s: int) -> torch.Tensor:
            return torch.randn(*s, generator=g) * 0.02
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"x": torch.randn(PROMPT_TOKENS, h, generator=g), "wq": w(h, q), "wk": w(h, kv),
                "wv": w(h, kv), "wo": w(q, h), "wg": w(h, self.inter), "wu": w(h, self.inter),
                "wd": w(self.inter, h)}

    def forward(self, p: dict[str, torch.Tensor]) -> torch.Tensor:
        x = p["x"]
        t = x.shape[0]
        q = (x @ p["wq"]).view(t, self.heads, self.head_dim).transpose(0, 1)
        k = (x @ p["wk"]).view(t, self.kv_heads, self.head_dim).transpose(0, 1)
        v = (x @ p["wv"]).view(t, self.kv_heads, self.head_dim).transpose(0, 1)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(0, 1).reshape(t, -1) @ p["wo"]
        return x + (torch.nn.functional.silu(x @ p["wg"]) * (x @ p["wu"])) @ p["wd"]


async def prefill_latency(transport: str, src_kv: torch.Tensor, layer_s: float | None,
                          reps: int, stripes: int = 1, clock: str = "thread") -> dict[str, float]:
    """Median prefill time alone vs with a layer-by-layer push and commit of its KV.

    ``layer_s``: per-layer compute simulated with a sleep; None runs the real CPU layer.
    ``clock``: "thread" runs the layers on a step thread that hands each finished layer to the
    loop (the prefill worker's engine thread and layer hook); "loop" awaits ``asyncio.sleep``
    on the loop itself. ``tail_ms`` is from the last layer's end to the COMMIT's ACK.
    """
    secret = new_secret()
    child = await start_receiver(transport, reps, "shuffled", secret)
    endpoint = Endpoint.decode((await child.line())["endpoint"])
    cfg = SenderConfig(secret, stripes=stripes)
    transports = [ShmTransport(cfg.limits)] if transport == "shm" else [TcpTransport(cfg.limits)]
    tx = Sender(src_kv, LAYOUT, cfg, transports)
    sim = LayerSim()
    params = sim.make() if layer_s is None else {}
    loop = asyncio.get_running_loop()
    delivery = LoopDelivery()

    def compute() -> None:
        if layer_s is None:
            sim.forward(params)
        else:
            time.sleep(layer_s)

    def step_thread(on_layer: Callable[[int], None] | None, ended: asyncio.Future[float]
                    ) -> None:
        """All layers on this (executor) thread; ``ended`` gets the time the last one ended,
        through the delivery after every layer's hand-over (as the worker's step outputs
        follow its layer hooks), so a commit never overtakes a layer's push."""
        for i in range(LAYOUT.num_layers):
            compute()
            if on_layer is not None:
                delivery.send(loop, on_layer, i)
        delivery.send(loop, ended.set_result, time.perf_counter())

    async def prefill(on_layer: Callable[[int], None] | None) -> float:
        """Run the layers (calling ``on_layer(i)`` on the loop after each); the time the
        last one ended."""
        if clock == "thread":
            ended: asyncio.Future[float] = loop.create_future()
            await loop.run_in_executor(None, step_thread, on_layer, ended)
            return await ended
        for i in range(LAYOUT.num_layers):
            if layer_s is None:
                await loop.run_in_executor(None, compute)
            else:
                await asyncio.sleep(layer_s)
            if on_layer is not None:
                on_layer(i)
        return time.perf_counter()

    src_sets, dst_sets = block_sets(seed=3), block_sets(seed=2)
    alone: list[float] = []
    shipped: list[float] = []
    tails: list[float] = []
    reserved: set[int] = set()
    for k in range(reps):
        t0 = time.perf_counter()
        await prefill(None)
        alone.append(time.perf_counter() - t0)
        while k not in reserved:
            reserved.add((await child.line())["reserved"])
        t0 = time.perf_counter()
        transfer = await tx.open(f"r{k}", endpoint, src_sets[k % SETS], dst_sets[k % SETS],
                                 time.monotonic() + 600)
        t_last = await prefill(lambda i, t=transfer: t.push(i, i + 1))
        await transfer.commit(1, -0.1)
        shipped.append(time.perf_counter() - t0)
        tails.append(time.perf_counter() - t_last)
    while not (await child.line()).get("done"):
        pass
    await tx.close()
    delivery.close()
    await child.finish()
    a, s = statistics.median(alone), statistics.median(shipped)
    return {"prefill_ms": a * 1e3, "with_transfer_ms": s * 1e3, "added_ms": (s - a) * 1e3,
            "added_pct": (s - a) / a * 100, "tail_ms": statistics.median(tails) * 1e3,
            "tail_pct": statistics.median(tails) / a * 100}


def time_cpu_layer(reps: int = 3) -> float:
    """Median seconds of one SmolLM2-shaped layer over 2,048 tokens on this CPU."""
    sim = LayerSim()
    params = sim.make()
    sim.forward(params)  # warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sim.forward(params)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# -- report ----------------------------------------------------------------------------------------


def machine() -> dict[str, object]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "torch": torch.__version__, "kernel": platform.release(),
            "torch_threads": torch.get_num_threads(), "loadavg": list(os.getloadavg())}


METHODS = ["raw", "tcp", "shm", "tcp_contiguous", "shm_contiguous", "memcpy"]
LABELS = {"raw": "raw socket", "tcp": "our TCP", "shm": "our shm",
          "tcp_contiguous": "TCP, contig ids", "shm_contiguous": "shm, contig ids",
          "memcpy": "memcpy"}


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vals = [results["throughput"][m]["gbps"] for m in METHODS]
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    ax.bar([LABELS[m] for m in METHODS], vals,
           color=["#888", "#1f77b4", "#2ca02c", "#aec7e8", "#98df8a", "#bbb"])
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    ax.set_ylabel("GB/s (median of rounds)")
    ax.set_title(f"KV transfer: {results['gib_moved']:.2f} GiB of SmolLM2 blocks per run, "
                 f"{results['machine']['cpus']} CPUs", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


async def main(args: argparse.Namespace) -> dict:
    req_bytes = LAYOUT.payload_bytes(LAYOUT.num_layers, BLOCKS_PER_REQ)
    n_requests = max(1, math.ceil(args.gib * (1 << 30) / req_bytes))
    nbytes = n_requests * req_bytes
    say(f"KV transfer bench: {n_requests} requests x {req_bytes / 1e6:.1f} MB "
        f"= {nbytes / (1 << 30):.2f} GiB per run, SmolLM2 layout, bf16, {args.rounds} rounds")
    say(f"machine: {machine()}")
    src_kv = make_cache(fill=True)
    samples: dict[str, list[Sample]] = {m: [] for m in METHODS}
    steps = args.rounds * len(METHODS)
    step = 0
    for r in range(args.rounds):
        for m in METHODS:
            step += 1
            if m == "raw":
                sample = await run_raw(nbytes)
            elif m == "memcpy":
                sample = run_memcpy(nbytes)
            else:
                transport, _, order = m.partition("_")
                sample = await run_ours(transport, n_requests, src_kv, order or "shuffled")
            samples[m].append(sample)
            say(f"[{step:2d}/{steps}] round {r + 1} {LABELS[m]:>16}: {sample.gbps:5.2f} GB/s  "
                f"cpu/GiB tx {sample.tx_cpu_per_gib:.2f}s rx {sample.rx_cpu_per_gib:.2f}s  "
                f"load {os.getloadavg()[0]:.2f}")
    med = {m: Sample(statistics.median(x.gbps for x in v),
                     statistics.median(x.tx_cpu_per_gib for x in v),
                     statistics.median(x.rx_cpu_per_gib for x in v)) for m, v in samples.items()}
    if args.throughput_only:
        report_throughput(med, samples)
        return {"throughput": {m: {"gbps": s.gbps, "all_gbps": [x.gbps for x in samples[m]]}
                               for m, s in med.items()}, "machine": machine()}
    layer_s = time_cpu_layer()
    say(f"one SmolLM2-shaped layer over {PROMPT_TOKENS} tokens on this CPU: "
        f"{layer_s * 1e3:.0f} ms")
    latency: dict[str, dict[str, float]] = {}
    cases: list[tuple[str, float | None]] = []
    if not args.no_cpu_layer:
        cases.append((f"cpu-layer-sim {layer_s * 1e3:.0f}ms", layer_s))
    cases += [(f"stated {ms:g}ms", ms / 1e3) for ms in args.layer_ms]
    if args.real_compute:
        cases.append(("real cpu compute", None))
    say(f"added latency of a {PROMPT_TOKENS}-token prompt's KV ({req_bytes / 1e6:.1f} MB), "
        f"layer by layer (layers on the {args.layer_clock} clock; median of {args.reps} for the "
        f"stated times, 1 run for CPU-sized layers):")
    for name, lay in cases:
        ways = [("tcp", 1), ("shm", 1)] + ([("tcp", args.stripes)] if args.stripes > 1 else [])
        for transport, stripes in ways:
            reps = args.reps if lay is not None and lay < 0.1 else 1  # a CPU prefill takes ~40 s
            res = await prefill_latency(transport, src_kv, lay, reps, stripes, args.layer_clock)
            label = transport if stripes == 1 else f"tcp x{stripes}"
            res["load"] = os.getloadavg()[0]
            latency[f"{name}/{label}"] = res
            say(f"  {name:>22} {label}: prefill {res['prefill_ms']:9.1f} ms, with transfer "
                f"{res['with_transfer_ms']:9.1f} ms, added {res['added_ms']:7.1f} ms "
                f"({res['added_pct']:+5.1f}%), tail after last layer {res['tail_ms']:.1f} ms, "
                f"load {res['load']:.2f}")
    results = {
        "machine": machine(), "gib_moved": nbytes / (1 << 30), "requests": n_requests,
        "rounds": args.rounds, "cpu_layer_ms": layer_s * 1e3,
        "throughput": {m: {"gbps": s.gbps, "tx_cpu_per_gib": s.tx_cpu_per_gib,
                           "rx_cpu_per_gib": s.rx_cpu_per_gib,
                           "all_gbps": [x.gbps for x in samples[m]]} for m, s in med.items()},
        "latency": latency,
    }
    report_throughput(med, samples)
    raw, mem = med["raw"], med["memcpy"]
    say(f"targets: TCP >= 80% of raw (now {med['tcp'].gbps / raw.gbps:.0%}); shm >= 50% of "
        f"memcpy (now {med['shm'].gbps / mem.gbps:.0%}); added latency < 5% of prefill "
        f"(now {latency[cases[0][0] + '/tcp']['added_pct']:+.1f}% tcp, "
        f"{latency[cases[0][0] + '/shm']['added_pct']:+.1f}% shm at {cases[0][0]})")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "kv_transfer.json"), "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
        plot(results, os.path.join(args.out, "kv_transfer.png"))
        say(f"wrote {args.out}/kv_transfer.json and {args.out}/kv_transfer.png")
    return results


def report_throughput(med: dict[str, Sample], samples: dict[str, list[Sample]]) -> None:
    """The throughput table: medians, and each ratio per round (raw and memcpy of the same
    round), which a shared machine's drift affects less than the medians."""
    raw, mem = med["raw"], med["memcpy"]
    say("")
    say(f"{'method':>16} {'GB/s':>6} {'vs raw':>7} {'vs memcpy':>9} {'tx cpu/GiB':>11} "
        f"{'rx cpu/GiB':>11}  per-round ratio (vs raw | vs memcpy)")
    for m in METHODS:
        s = med[m]
        per_round = " ".join(f"{x.gbps / r.gbps:.0%}|{x.gbps / c.gbps:.0%}"
                             for x, r, c in zip(samples[m], samples["raw"], samples["memcpy"],
                                                strict=True))
        say(f"{LABELS[m]:>16} {s.gbps:6.2f} {s.gbps / raw.gbps:7.0%} {s.gbps / mem.gbps:9.0%} "
            f"{s.tx_cpu_per_gib:10.2f}s {s.rx_cpu_per_gib:10.2f}s  {per_round}")


def cli() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="GiB to move per run (>= 1)")
    parser.add_argument("--out", default=None, help="write kv_transfer.json/.png here")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per method")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per latency case")
    parser.add_argument("--layer-ms", type=float, nargs="*", default=[1.0, 10.0],
                        help="stated per-layer compute times to simulate")
    parser.add_argument("--layer-clock", choices=("thread", "loop"), default="thread",
                        help="latency cases: layers on a step thread that hands each to the "
                             "loop, as the prefill worker's engine does (default), or "
                             "asyncio.sleep on the loop (the method before)")
    parser.add_argument("--real-compute", action="store_true",
                        help="also run the CPU layer for real (slow: ~1 s per layer here)")
    parser.add_argument("--throughput-only", action="store_true",
                        help="only the throughput rounds (no latency cases)")
    parser.add_argument("--no-cpu-layer", action="store_true",
                        help="latency cases: only the stated layer times (not the ~16 s CPU one)")
    parser.add_argument("--stripes", type=int, default=1,
                        help="latency cases: also TCP striped over this many connections")
    parser.add_argument("--child", nargs=2, metavar=("raw", "NBYTES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child[0] != "raw":
            parser.error("--child: only the raw receiver runs here")
        child_raw(int(args.child[1]))
        return
    asyncio.run(main(args))


if __name__ == "__main__":
    cli()
