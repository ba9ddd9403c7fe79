"""Disaggregation on real slow links: prefill and decode workers in two network namespaces
joined by a rate-limited veth pair, adaptive vs always-remote vs colocated, beside the
planner's prediction for the same link.

    sudo python -m bench.serving.netem_links [--links 1,10,25] [--rtt-ms 1] \\
        [--rate 0.3] [--num-requests 16] [--out docs/bench]

Needs root, ``ip`` with ``netns`` and ``tc`` (Debian/Ubuntu: ``apt install iproute2``; the
Makefile does not, only this benchmark). What it builds, and removes on every exit path
(normal end, exception, SIGINT/SIGTERM, interpreter exit)::

    namespace tlk<pid>d  (decode side)          namespace tlk<pid>p  (prefill side)
      decode worker   10.77.0.1:*                 prefill worker  10.77.0.2:*
      router          127.0.0.1 (dials both)
      load generator  (tandem bench, loopback)
            veth tlk<pid>d0 10.77.0.1/30  <====>  veth tlk<pid>p0 10.77.0.2/30
            egress: tbf rate G Gb/s (each way; netem delay RTT/2 as well where the
            kernel has sch_netem: otherwise no added delay, and the table says so)

Only addresses inside the namespaces it made (10.77.0.0/30) are used; the workers run with
``--no-kv-shm`` so the KV crosses the link (a Unix socket would not). Per link speed the
disaggregated setups (1 prefill worker on core 0, 1 decode worker on core 1) run adaptive
placement (the router's default; its link prior left at the default 10 Gb/s, so what it
knows of the link it learns from its pushes) and ``--placement remote``; the colocated setup
(one decode worker, 2 threads, no prefill worker: no link in its path) runs once and stands
in every row. Each cell is fresh processes and the same Poisson sequence of the mixed
workload (tandem/loadgen/workload.py). Goodput is the rate of requests inside both SLO
targets; the planner's prediction is tandem/planner/sim on the measured CPU profiles
(tests/data/planner/profile_cpu{1,2}.json) with the same requests and the cell's link.

On 2 shared cores the absolute numbers are noisy (the router, the load generator and the
kernel's shaping share them with the workers); each cell is short (``--num-requests``, 16 at
0.3/s by default: about a minute of arrivals) so the whole run stays around 10-15 minutes.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "tests" / "data" / "planner"
SUBNET = ("10.77.0.1", "10.77.0.2")  # decode side, prefill side (a /30)
SETUPS = ("adaptive", "remote", "colocated")


def note(msg: str) -> None:
    print(f"[netem-links] {msg}", file=sys.stderr, flush=True)


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why namespaces with shaped links cannot be built here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (apt install iproute2)"
    probe = f"tlkprobe{os.getpid()}"
    try:
        made = _run("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"`ip netns add` failed: {made.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class LinkedNamespaces:
    """Two namespaces joined by a veth pair shaped to ``gbps`` (and ``rtt_ms`` where netem
    exists). ``build`` makes them; ``remove`` (idempotent, also run at exit and on SIGINT/
    SIGTERM) deletes both namespaces, which takes the veth pair and its qdiscs with them."""

    gbps: float
    rtt_ms: float = 0.0
    tag: str = field(default_factory=lambda: f"tlk{os.getpid() % 100000}")
    rtt_emulated: bool = False
    _made: list[str] = field(default_factory=list)

    @property
    def decode_ns(self) -> str:
        return f"{self.tag}d"

    @property
    def prefill_ns(self) -> str:
        return f"{self.tag}p"

    def _veth(self, side: str) -> str:
        return f"{self.tag}{side}0"

    def build(self) -> LinkedNamespaces:
        """Create, address and shape; on any failure remove what was made and raise."""
        _CLEANUPS.append(self.remove)
        try:
            for ns in (self.decode_ns, self.prefill_ns):
                _run("ip", "netns", "add", ns)
                self._made.append(ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
            vd, vp = self._veth("d"), self._veth("p")
            _run("ip", "link", "add", vd, "netns", self.decode_ns, "type", "veth",
                 "peer", "name", vp, "netns", self.prefill_ns)
            for ns, dev, addr in ((self.decode_ns, vd, SUBNET[0]),
                                  (self.prefill_ns, vp, SUBNET[1])):
                _run("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
                _run("ip", "-n", ns, "link", "set", dev, "up")
                self._shape(ns, dev)
        except BaseException:
            self.remove()
            raise
        return self

    def _shape(self, ns: str, dev: str) -> None:
        rate = f"{self.gbps:g}gbit"
        if self.rtt_ms > 0:
            delay = f"{self.rtt_ms / 2:g}ms"
            netem = _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                         "netem", "delay", delay, "rate", rate, "limit", "100000", check=False)
            if netem.returncode == 0:
                self.rtt_emulated = True
                return
        # A bucket of a few ms at line rate (at least 64 kB): bursts of a frame pass whole.
        burst = max(int(self.gbps * 1e9 / 8 * 0.002), 65536)
        _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
             "rate", rate, "burst", str(burst), "latency", "100ms")

    def qdiscs(self) -> str:
        """Both ends' qdiscs as tc shows them (for the record)."""
        return "\n".join(_run("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev",
                              self._veth(side)).stdout.strip()
                         for ns, side in ((self.decode_ns, "d"), (self.prefill_ns, "p")))

    def wrap(self, side: str) -> tuple[str, ...]:
        """The command prefix that runs a process in ``side``'s namespace."""
        return ("ip", "netns", "exec", self.decode_ns if side == "d" else self.prefill_ns)

    def remove(self) -> None:
        """Delete every namespace made (their processes must be gone: Cluster.stop first)."""
        while self._made:
            _run("ip", "netns", "del", self._made.pop(), check=False)


# -- every exit path removes what was built ---------------------------------------------------

_CLEANUPS: list = []


def _cleanup() -> None:
    while _CLEANUPS:
        try:
            _CLEANUPS.pop()()
        except Exception as exc:  # keep removing the rest
            note(f"cleanup step failed: {exc!r}")


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _cleanup()
    raise SystemExit(128 + signum)


def install_cleanup() -> None:
    """Run the cleanups at exit and on SIGINT/SIGTERM."""
    atexit.register(_cleanup)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)


def leftovers(tag: str) -> list[str]:
    """Namespaces or links named with ``tag`` that still exist (none after ``remove``)."""
    names = _run("ip", "netns", "list").stdout.split()
    links = _run("ip", "-o", "link", "show").stdout
    return [n for n in names if n.startswith(tag)] + [
        line.split(":")[1].strip() for line in links.splitlines() if tag in line]


# -- one cell: processes in the namespaces, the load from inside the decode side ---------------

def _engine(model: str, threads: int, extra: Sequence[str]) -> list[str]:
    return ["--model", model, "--threads", str(threads), "--no-kv-shm", *extra]


def run_cell(setup: str, ns: LinkedNamespaces | None, args: argparse.Namespace,
             out: Path) -> dict:
    """Start ``setup``'s processes (``ns`` None: colocated, on loopback in this namespace),
    run the load through its router, stop everything; returns the load's summary."""
    from tandem.launcher.local_cluster import Cluster

    cluster = Cluster()
    _CLEANUPS.append(cluster.stop)
    pin = len(os.sched_getaffinity(0)) >= 2
    core = (lambda c: ("taskset", "-c", str(c))) if pin else (lambda c: ())
    slo = ["--slo-ttft-s", str(args.slo_ttft), "--slo-tpot-s", str(args.slo_tpot)]
    try:
        if ns is None:
            decode = cluster.start("tandem.worker.decode", "--port", "0", "--kv-port", "0",
                                   *_engine(args.model, 2, args.engine_arg))
            router = cluster.start("tandem.router", "--port", "0", "--http-port", "0",
                                   "--tokenizer", str(args.model_dir), "--model-name", "bench",
                                   "--decode", decode.grpc, *slo)
            load_wrap: tuple[str, ...] = ()
        else:
            decode = cluster.start(
                "tandem.worker.decode", "--host", SUBNET[0], "--port", "0", "--kv-port", "0",
                *_engine(args.model, 1, args.engine_arg), wrap=(*ns.wrap("d"), *core(1)))
            prefill = cluster.start(
                "tandem.worker.prefill", "--host", SUBNET[1], "--port", "0",
                *_engine(args.model, 1, args.engine_arg), wrap=(*ns.wrap("p"), *core(0)))
            placement = ["--placement", "remote"] if setup == "remote" else []
            router = cluster.start(
                "tandem.router", "--port", "0", "--http-port", "0", "--tokenizer",
                str(args.model_dir), "--model-name", "bench", "--decode", decode.grpc,
                "--prefill", prefill.grpc, *slo, *placement, wrap=ns.wrap("d"))
            load_wrap = ns.wrap("d")
        bench = [*load_wrap, sys.executable, "-m", "tandem.cli.main", "bench", "--target",
                 router.grpc, "--no-progress", "--mix", args.mix, "--seed", str(args.seed),
                 "--slo-ttft", str(args.slo_ttft), "--slo-tpot", str(args.slo_tpot),
                 "--timeout", str(args.request_timeout)]
        warm = subprocess.run([*bench, "--mix", "chat", "--num-requests", "1", "--rate", "1",
                               "--seed", str(args.seed + 1)], cwd=ROOT, capture_output=True,
                              text=True, timeout=args.request_timeout + 60)
        if warm.returncode != 0:
            raise RuntimeError(f"warm-up failed: {warm.stdout[-2000:]}{warm.stderr[-2000:]}")
        path = out / f"{setup}-{ns.gbps:g}.json" if ns else out / f"{setup}.json"
        run = subprocess.run([*bench, "--rate", str(args.rate), "--num-requests",
                              str(args.num_requests), "--json", str(path)], cwd=ROOT,
                             capture_output=True, text=True,
                             timeout=args.num_requests / args.rate + args.request_timeout + 60)
        if not path.exists():
            raise RuntimeError(f"the load wrote nothing: {run.stdout[-2000:]}"
                               f"{run.stderr[-2000:]}")
        data = json.loads(path.read_text())
        summary = data["summary"]
        summary["decisions"] = _decisions(router)
        # the host's load over the last minute: other work on a shared box shows here
        summary["loadavg_1m"] = float(Path("/proc/loadavg").read_text().split()[0])
        return summary
    finally:
        cluster.stop()
        _CLEANUPS.remove(cluster.stop)


def _decisions(router) -> dict[str, float]:
    """tandem_disagg_decision_total by decision/reason, from the router's /metrics (read
    from inside its namespace when it has one: the address is its loopback)."""
    http = router.info.get("http")
    if not http:
        return {}
    args = list(router.popen.args)
    wrap = args[:4] if args[:3] == ["ip", "netns", "exec"] else []
    fetch = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
             f"'http://{http}/metrics', timeout=20).read().decode())")
    got = subprocess.run([*wrap, sys.executable, "-c", fetch], capture_output=True,
                         text=True, timeout=30, check=False)
    found: dict[str, float] = {}
    for line in got.stdout.splitlines():
        if line.startswith("tandem_disagg_decision_total{"):
            labels, value = line.rsplit(" ", 1)
            found[labels[len("tandem_disagg_decision_total"):]] = float(value)
    return found


# -- the planner's prediction for the same requests and link ----------------------------------

def predict(setup: str, gbps: float, rtt_ms: float, args: argparse.Namespace) -> dict:
    """tandem/planner/sim for this cell: 1 prefill + 1 decode worker on the one-thread
    profile (adaptive or remote), or one colocated worker on the two-thread profile."""
    from tandem.loadgen.workload import MIXES, make_requests
    from tandem.placement.link import LinkPrior
    from tandem.placement.slo import Slo
    from tandem.planner.link_report import with_link
    from tandem.planner.profile import Profile
    from tandem.planner.sim import ClusterSpec, simulate
    from tandem.planner.trace import TraceRequest

    lo, hi = (int(x) for x in args.vocab.split(","))
    specs = make_requests(MIXES[args.mix], args.rate, args.num_requests, seed=args.seed,
                          vocab=(lo, hi))
    trace = [TraceRequest(s.arrival_s, len(s.prompt_ids), s.max_tokens) for s in specs]
    slo = Slo(args.slo_ttft, args.slo_tpot)
    one = Profile.load(PROFILES / "profile_cpu1.json")
    if setup == "colocated":
        result = simulate(ClusterSpec(0, 1, placement="local", slo=slo),
                          Profile.load(PROFILES / "profile_cpu2.json"), trace)
    else:
        linked = with_link(one, LinkPrior(gbps, rtt_ms / 1000.0))
        spec = ClusterSpec(1, 1, placement="adaptive" if setup == "adaptive" else "remote",
                           slo=slo)
        result = simulate(spec, one, trace, prefill_profile=linked)
    s = result.summary(slo)
    return {"goodput_rps": s.goodput_rps, "ttft_p90_s": s.ttft_p90_s,
            "attainment": s.slo_attainment, "decisions": s.decisions}


# -- the table, the plot, the page --------------------------------------------------------------

def _row(setup: str, gbps: float, measured: dict, predicted: dict) -> dict:
    return {"setup": setup, "gbps": gbps, "goodput_rps": measured["goodput_rps"],
            "ttft_p90_s": measured["ttft"]["p90"], "attainment": measured["goodput_share"],
            "failed": measured["failed"], "decisions": measured.get("decisions", {}),
            "loadavg_1m": measured.get("loadavg_1m"),
            "predicted_goodput_rps": predicted["goodput_rps"],
            "predicted_ttft_p90_s": predicted["ttft_p90_s"]}


def table(rows: list[dict]) -> str:
    head = ("| link Gb/s | setup | goodput req/s | planner req/s | planner/measured | "
            "TTFT p90 s | planner TTFT p90 s | attainment | host load |\n"
            "|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        ratio = (r["predicted_goodput_rps"] / r["goodput_rps"] if r["goodput_rps"] > 0
                 else float("nan"))
        lines.append(f"| {r['gbps']:g} | {r['setup']} | {r['goodput_rps']:.3f} | "
                     f"{r['predicted_goodput_rps']:.3f} | {ratio:.2f} | "
                     f"{r['ttft_p90_s']:.2f} | {r['predicted_ttft_p90_s']:.2f} | "
                     f"{r['attainment']:.0%} | {r.get('loadavg_1m') or float('nan'):.1f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> bool:
    """Goodput per link and setup, measured (bars) and planned (markers); False without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    links = sorted({r["gbps"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.25
    for i, setup in enumerate(SETUPS):
        got = {r["gbps"]: r for r in rows if r["setup"] == setup}
        xs = [k + (i - 1) * width for k in range(len(links))]
        ax.bar(xs, [got[g]["goodput_rps"] if g in got else 0 for g in links], width,
               label=f"{setup} measured")
        ax.plot(xs, [got[g]["predicted_goodput_rps"] if g in got else float("nan")
                     for g in links], "k_", markersize=14)
    ax.set_xticks(range(len(links)), [f"{g:g} Gb/s" for g in links])
    ax.set_ylabel("goodput (req/s inside both SLOs)")
    ax.set_title("mixed workload over a shaped veth (bars: measured, dashes: planner)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.netem_links", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--links", default="1,10,25", help="comma list of link speeds, Gb/s")
    p.add_argument("--rtt-ms", type=float, default=1.0, help="added RTT (needs sch_netem)")
    p.add_argument("--setups", default=",".join(SETUPS))
    p.add_argument("--model", default="smollm2")
    p.add_argument("--engine-arg", action="append", default=[], help="extra worker flag")
    p.add_argument("--mix", default="mixed")
    p.add_argument("--rate", type=float, default=0.3)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", default="1000,30000")
    p.add_argument("--slo-ttft", type=float, default=4.0)
    p.add_argument("--slo-tpot", type=float, default=0.25)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=None, help="write links.{json,md,png} here")
    args = p.parse_args(argv)
    why = unavailable()
    if why is not None:
        print(f"netem_links: cannot build shaped namespaces here: {why}", file=sys.stderr)
        return 2
    from tandem.engine.loader import resolve_model

    args.model_dir = resolve_model(args.model)
    install_cleanup()
    links = [float(x) for x in args.links.split(",")]
    setups = args.setups.split(",")
    work = Path(tempfile.mkdtemp(prefix="netem-links-"))
    _CLEANUPS.insert(0, lambda: shutil.rmtree(work, ignore_errors=True))
    rows: list[dict] = []
    rtt_emulated = False
    qdiscs = ""
    t0 = time.monotonic()
    colocated = None
    if "colocated" in setups:
        note("colocated (no link in its path) ...")
        colocated = run_cell("colocated", None, args, work)
    for gbps in links:
        for setup in (s for s in setups if s != "colocated"):
            ns = LinkedNamespaces(gbps, args.rtt_ms).build()
            try:
                rtt_emulated, qdiscs = ns.rtt_emulated, ns.qdiscs()
                note(f"{setup} at {gbps:g} Gb/s ({time.monotonic() - t0:.0f} s in) ...")
                measured = run_cell(setup, ns, args, work)
            finally:
                ns.remove()
            rows.append(_row(setup, gbps, measured, predict(setup, gbps, args.rtt_ms, args)))
            note(f"  goodput {rows[-1]['goodput_rps']:.3f} req/s, "
                 f"planner {rows[-1]['predicted_goodput_rps']:.3f}; {rows[-1]['decisions']}")
        if colocated is not None:
            rows.append(_row("colocated", gbps, colocated, predict("colocated", gbps,
                                                                     args.rtt_ms, args)))
    text = table(rows)
    print(text)
    print(f"RTT emulated: {rtt_emulated}; qdiscs of the last cell:\n{qdiscs}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        config = {k: str(v) for k, v in vars(args).items() if k != "out"}
        (args.out / "links.json").write_text(json.dumps(
            {"config": config, "rtt_emulated": rtt_emulated, "qdiscs": qdiscs, "rows": rows},
            indent=1))
        drawn = plot(rows, args.out / "links.png")
        note(f"wrote {args.out}/links.json" + (", links.png" if drawn else
                                               " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
