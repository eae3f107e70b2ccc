"""Load and soak of one `meshroute serve` process in front of emulated nodes, against calling
the nodes directly under the same load in the same run.

  scripts/isolated python benchmarks/bench_load.py [--seconds 5] [--rounds 3]
      [--streams 100,1000] [--stream-seconds 30] [--soak-seconds 600] [--pin] [--json PATH]

(re-runs itself under scripts/isolated when not already inside a namespace of its own.)
Two `meshroute node --emulate` processes: `fast` answers 16 tokens at once (for wrk's
non-streaming load), `paced` streams tokens at --stream-tps tokens/s per request, so a stream
stays open --stream-tokens / --stream-tps seconds (what holding 1,000 streams needs). Phases:
 1. non-streaming, wrk -t1 with a Lua POST body, c=1 and c=32, direct and through the gateway,
    interleaved over --rounds (median reported): req/s and p50/p95/p99 latency;
 2. SSE: an asyncio/aiohttp client holds N streams for --stream-seconds (each worker reopens
    a stream when one ends), direct then through the gateway: TTFT, streams held, chunk gaps;
 3. soak: --soak-streams SSE streams plus wrk c=--soak-connections, through the gateway, for
    --soak-seconds; the gateway's RSS sampled every second: does it keep growing after the
    first --soak-warmup share of the run?
Throughout, a stall probe (a separate blocking process) GETs the gateway's /healthz every
10 ms and logs each latency: the longest one bounds the longest event-loop stall from above.
The gateway's CPU time (/proc/PID/stat) and RSS (statm, VmHWM) are read around each phase,
and (benchmarks/_hooks) its event loop's lag and every garbage collection, by wall clock and
by CPU time. --pin: the gateway and the probe on one CPU, everything else on the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _load as L
from benchmarks import _procs as P

CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5, help="wrk run length")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", default="1,32", help="wrk connection counts")
    p.add_argument("--streams", default="100,1000", help="SSE stream counts to hold")
    p.add_argument("--stream-seconds", type=float, default=30)
    p.add_argument("--stream-tps", type=float, default=1.0, help="tokens/s of one stream")
    p.add_argument("--stream-tokens", type=int, default=15, help="tokens per stream")
    p.add_argument("--soak-seconds", type=float, default=90)
    p.add_argument("--soak-warmup", type=float, default=0.25, help="share of the soak")
    p.add_argument("--soak-streams", type=int, default=300)
    p.add_argument("--soak-connections", type=int, default=4)
    p.add_argument("--flat-mb", type=float, default=2.0,
                   help="RSS counts as flat when it grows by at most this (or 2 %%) after "
                        "warm-up")
    p.add_argument("--json", default=str(P.ROOT / "benchmarks/results/load.json"))
    p.add_argument("--probe-interval", type=float, default=0.01, help="seconds")
    p.add_argument("--py-spy", metavar="DIR", help="profile the gateway with py-spy during "
                   "each gateway SSE phase; collapsed stacks go to DIR")
    p.add_argument("--no-loop-hook", action="store_true",
                   help="don't run the gateway with the loop-lag/GC hook (benchmarks/_hooks)")
    p.add_argument("--gateway-gc-threshold", metavar="G0,G1,G2",
                   help="experiment: run the gateway with these gc thresholds (via the hook)")
    p.add_argument("--gateway-gc-freeze-after", type=float, metavar="S",
                   help="experiment: gc.freeze() again in the gateway S seconds after its start "
                        "(meshroute serve already freezes its start-up heap before serving)")
    p.add_argument("--gateway-gc-refreeze", action="store_true",
                   help="experiment: gc.freeze() in the gateway after every full collection "
                        "(via the hook), so the next one walks only what was promoted since")
    p.add_argument("--pin", action="store_true",
                   help="the gateway (and the stall probe) on the last CPU alone, the load "
                        "generator, wrk and the emulated nodes on the others (taskset / "
                        "sched_setaffinity): a stall is then the gateway's own, not time it "
                        "waited while the load generator held its core")
    p.add_argument("--no-isolate", action="store_true", help="don't re-run in scripts/isolated")
    return p.parse_args()


def stream_body(args: argparse.Namespace) -> dict[str, Any]:
    return {"model": "paced", "stream": True, "max_tokens": args.stream_tokens,
            "messages": [{"role": "user", "content": "hi"}]}


async def run(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    streams = [int(x) for x in args.streams.split(",") if x]
    slots = max([*streams, args.soak_streams]) + 64
    gw_cpus: set[int] | None = None
    if args.pin:  # before anything starts: the nodes, wrk and py-spy inherit the load's CPUs
        gw_cpus, load_cpus = P.pin_split()
        P.pin_self(load_cpus)
        args.cpus = {"gateway_and_probe": sorted(gw_cpus), "load_and_nodes": sorted(load_cpus)}
    with P.processes() as procs:
        fast, fast_pid = P.start_emulator(procs, "fast-0", "fast", 1e6, 64, 4096,
                                          logs / "fast.log")
        paced, paced_pid = P.start_emulator(procs, "paced-0", "paced", args.stream_tps,
                                            slots, 4 * slots, logs / "paced.log")
        hook = None if args.no_loop_hook else logs / "loop-hook.jsonl"
        gw, gw_pid = P.start_gateway(procs, {"fast-0": ("fast", fast),
                                             "paced-0": ("paced", paced)}, logs / "gw.log", hook,
                                     args.gateway_gc_threshold, args.gateway_gc_freeze_after,
                                     cpus=gw_cpus, gc_refreeze=args.gateway_gc_refreeze)
        args.hook = hook
        pids = {"gateway": gw_pid, "fast_node": fast_pid, "paced_node": paced_pid}
        with (L.Probe(gw, "/healthz", args.probe_interval, gw_cpus) as probe,
              P.RssSampler(pids, 1.0) as rss):
            out: dict[str, Any] = {"rss_idle_mb": P.rss_mb(gw_pid)}
            for target in (fast, gw):  # warm-up: pools, caches, first enumeration
                await L.wrk(target + "/v1/chat/completions", json.dumps(CHAT), 8, 1)
            await L.hold_streams(gw + "/v1/chat/completions", stream_body(args), 20,
                                 args.stream_tokens / args.stream_tps, 0.5)
            out["nonstream"] = await nonstream(args, fast, gw, gw_pid, probe)
            out["sse"] = await sse(args, streams, paced, gw, gw_pid, probe, rss)
            out["soak"] = await soak(args, gw, gw_pid, probe, rss)
            out["gateway_peak_rss_mb"] = P.hwm_mb(gw_pid)
            out["rss_after_mb"] = P.rss_mb(gw_pid)
    return out


async def nonstream(args: argparse.Namespace, fast: str, gw: str, gw_pid: int,
                    probe: L.Probe) -> dict[str, Any]:
    conns = [int(x) for x in args.connections.split(",") if x]
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for c in conns:
            for name, url in (("direct", fast), ("gateway", gw)):
                print(f"\rnon-streaming round {r + 1}/{args.rounds} c={c} {name:<8}",
                      end="", file=sys.stderr, flush=True)
                res = await L.measure(L.wrk(url + "/v1/chat/completions", json.dumps(CHAT),
                                            c, args.seconds), gw_pid, probe, args.hook)
                runs.setdefault(f"{name} c={c}", []).append(res)
    print(file=sys.stderr)
    out: dict[str, Any] = {}
    for key, rs in runs.items():
        med = L.median_of(rs)
        for k in ("probe_max_ms", "loop_lag_max_ms", "loop_cpu_lag_max_ms",
                  "gc_pause_max_ms"):  # worst round
            if k in rs[0]:
                med[k] = max(r[k] for r in rs)
        for k in ("errors", "probes_over_50ms", "loop_lags_over_50ms",
                  "loop_cpu_lags_over_50ms"):  # all rounds
            if k in rs[0]:
                med[k] = sum(r[k] for r in rs)
        out[key] = med
    # While wrk calls the node directly the gateway serves only the probe (and its own
    # timers): that CPU rate is taken off the gateway's runs to give its cost per request.
    idle = [r["server_cpu_s"] / r["seconds"] for key, rs in runs.items()
            if key.startswith("direct") for r in rs]
    idle_rate = statistics.median(idle)
    out["gateway_cpu_s_per_s_serving_only_the_probe"] = idle_rate
    for key, rs in runs.items():
        if key.startswith("gateway"):
            out[key]["gateway_cpu_us_per_request"] = statistics.median(
                r["server_cpu_s"] * 1e6 / max(r["requests"], 1) for r in rs)
            out[key]["gateway_cpu_us_per_request_net_of_probe"] = statistics.median(
                (r["server_cpu_s"] - idle_rate * r["seconds"]) * 1e6 / max(r["requests"], 1)
                for r in rs)
    for c in conns:
        d, g = out[f"direct c={c}"], out[f"gateway c={c}"]
        out[f"ratio c={c}"] = {
            "rps_gateway_over_direct": g["rps"] / d["rps"] if d["rps"] else None,
            **{f"added_{q}_ms": g[f"{q}_ms"] - d[f"{q}_ms"] for q in ("p50", "p95", "p99")}}
    return out


async def sse(args: argparse.Namespace, streams: list[int], paced: str, gw: str, gw_pid: int,
              probe: L.Probe, rss: P.RssSampler) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ramp = min(args.stream_tokens / args.stream_tps, args.stream_seconds / 3)
    for n in streams:
        for name, url in (("direct", paced), ("gateway", gw)):
            print(f"SSE: holding {n} streams {name} for {args.stream_seconds} s",
                  file=sys.stderr, flush=True)
            load = L.hold_streams(url + "/v1/chat/completions", stream_body(args), n,
                                  args.stream_seconds, ramp)
            with P.py_spy(gw_pid if name == "gateway" else None, args.py_spy,
                          f"gateway-{n}-streams", args.stream_seconds):
                res = await L.measure(load, gw_pid, probe, args.hook)
            if name == "gateway":
                t0, t1 = res["window"]
                res["gateway_rss_max_mb"] = max(
                    (mb for _, mb in rss.window("gateway", t0, t1)), default=float("nan"))
                res["gateway_cpu_us_per_chunk"] = (res["server_cpu_s"] * 1e6
                                                   / max(res["chunks"], 1))
            out[f"{name} {n} streams"] = res
        d, g = out[f"direct {n} streams"], out[f"gateway {n} streams"]
        out[f"ratio {n} streams"] = {
            "chunks_per_s_gateway_over_direct": (g["chunks_per_s"] / d["chunks_per_s"]
                                                 if d["chunks_per_s"] else None),
            **{f"added_ttft_{q}_ms": g[f"ttft_{q}_ms"] - d[f"ttft_{q}_ms"]
               for q in ("p50", "p95", "p99")}}
    return out


async def soak(args: argparse.Namespace, gw: str, gw_pid: int, probe: L.Probe,
               rss: P.RssSampler) -> dict[str, Any]:
    print(f"soak: {args.soak_streams} SSE streams + wrk c={args.soak_connections} for "
          f"{args.soak_seconds} s", file=sys.stderr, flush=True)
    loads = asyncio.gather(
        L.hold_streams(gw + "/v1/chat/completions", stream_body(args), args.soak_streams,
                       args.soak_seconds, min(5.0, args.soak_seconds / 10)),
        L.wrk(gw + "/v1/chat/completions", json.dumps(CHAT), args.soak_connections,
              args.soak_seconds, timeout_s=30))
    res = await L.measure(_tupled(loads), gw_pid, probe, args.hook)
    t0, t1 = res["window"]
    series = rss.window("gateway", t0, t1)
    warm = t0 + args.soak_warmup * (t1 - t0)
    after = [(t, mb) for t, mb in series if t >= warm]
    res["rss_series_mb"] = [(round(t - t0, 1), round(mb, 2)) for t, mb in series]
    res.update(rss_trend(after))
    if "rss_growth_after_warmup_mb" in res:
        allowed = max(args.flat_mb, 0.02 * res["rss_after_warmup_first_mb"])
        res["rss_flat"] = res["rss_growth_after_warmup_mb"] <= allowed
        res["rss_flat_rule_mb"] = allowed
    return res


async def _tupled(loads: Any) -> dict[str, Any]:
    streams, nonstream = await loads
    return {"sse": streams, "wrk": nonstream}


def rss_trend(series: list[tuple[float, float]]) -> dict[str, float]:
    """Least-squares slope of RSS (MB/min) after warm-up, and the first and last tenth's
    medians: growth = last - first."""
    if len(series) < 10:
        return {}
    ts = [t for t, _ in series]
    ms = [mb for _, mb in series]
    slope = statistics.linear_regression(ts, ms).slope * 60
    tenth = max(1, len(series) // 10)
    first, last = statistics.median(ms[:tenth]), statistics.median(ms[-tenth:])
    return {"rss_after_warmup_first_mb": first, "rss_after_warmup_last_mb": last,
            "rss_growth_after_warmup_mb": last - first, "rss_slope_mb_per_min": slope,
            "rss_after_warmup_max_mb": max(ms), "post_warmup_minutes": (ts[-1] - ts[0]) / 60}


def main() -> int:
    return P.run_bench(__file__, parse_args(), run, report)


def report(res: dict[str, Any]) -> None:
    meta = res["meta"]
    print(f"\nload average before/after: {meta['load_average_before']} / "
          f"{meta['load_average_after']}; pinned: {meta['args'].get('cpus') or 'no'}")
    nan = float("nan")
    print("\n| case | req/s | p50 ms | p95 ms | p99 ms | errors | gw CPU µs/req (net of probe) "
          "| probe max ms | loop lag max ms | busy lag max ms | GC pause max ms (CPU) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, r in res["nonstream"].items():
        if not key.startswith(("direct", "gateway c")):
            continue
        print(f"| {key} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | "
              f"{r['p99_ms']:.2f} | {r['errors']} | "
              f"{r.get('gateway_cpu_us_per_request', float('nan')):.0f} "
              f"({r.get('gateway_cpu_us_per_request_net_of_probe', float('nan')):.0f}) | "
              f"{r['probe_max_ms']:.1f} | {r.get('loop_lag_max_ms', nan):.1f} | "
              f"{r.get('loop_cpu_lag_max_ms', nan):.1f} | {r.get('gc_pause_max_ms', nan):.1f} "
              f"({r.get('gc_pause_cpu_max_ms', nan):.1f}) |")
    for key, r in res["nonstream"].items():
        if key.startswith("ratio"):
            print(f"{key}: " + ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} n/a"
                                       for k, v in r.items()))
    print("\n| case | held (peak) | ok | failed | chunks/s | TTFT p50 | p95 | p99 | "
          "max chunk gap ms | gw RSS max MB | probe max ms | >50 ms | loop lag max ms | "
          ">50 ms | busy lag max ms | >50 ms | beat late max ms | GC pause max ms (CPU) | "
          "full GCs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
          "---:|---:|")
    for key, r in res["sse"].items():
        if key.startswith("ratio"):
            continue
        print(f"| {key} | {r['peak_open_streams']} | {r['streams_ok']} | "
              f"{r['streams_failed']} | {r['chunks_per_s']:,.0f} | {r['ttft_p50_ms']:.1f} | "
              f"{r['ttft_p95_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['chunk_gap_max_ms']:.0f} | "
              f"{r.get('gateway_rss_max_mb', float('nan')):.1f} | {r['probe_max_ms']:.1f} | "
              f"{r['probes_over_50ms']} | {r.get('loop_lag_max_ms', nan):.1f} | "
              f"{r.get('loop_lags_over_50ms', nan)} | {r.get('loop_cpu_lag_max_ms', nan):.1f} | "
              f"{r.get('loop_cpu_lags_over_50ms', nan)} | "
              f"{r.get('heartbeat_late_max_ms', nan):.1f} | {r.get('gc_pause_max_ms', nan):.1f} "
              f"({r.get('gc_pause_cpu_max_ms', nan):.1f}) | "
              f"{(r.get('gc_by_generation') or {}).get('n', [0, 0, '—'])[2]} |")
        if r["errors"]:
            print(f"  errors: {r['errors']}")
    for key, r in res["sse"].items():
        if key.startswith("ratio"):
            print(f"{key}: " + ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} n/a"
                                       for k, v in r.items()))
    s = res["soak"]
    print(f"\nsoak: {s['sse']['streams_ok']} streams ok, {s['sse']['streams_failed']} failed, "
          f"peak {s['sse']['peak_open_streams']} open; wrk {s['wrk']['requests']} requests "
          f"({s['wrk']['rps']:,.0f}/s, {s['wrk']['errors']} errors); probe max "
          f"{s['probe_max_ms']:.1f} ms, {s['probes_over_50ms']} over 50 ms; loop lag max "
          f"{s.get('loop_lag_max_ms', nan):.1f} ms, {s.get('loop_lags_over_50ms')} over 50 ms "
          f"(busy: {s.get('loop_cpu_lag_max_ms', nan):.1f} ms, "
          f"{s.get('loop_cpu_lags_over_50ms')} over 50 ms; heartbeat late max "
          f"{s.get('heartbeat_late_max_ms', nan):.1f} ms); "
          f"GC pause max {s.get('gc_pause_max_ms', nan):.1f} ms (CPU "
          f"{s.get('gc_pause_cpu_max_ms', nan):.1f} ms), "
          f"{(s.get('gc_by_generation') or {}).get('n', [0, 0, '—'])[2]} full collections, "
          f"uncollectable {sum((s.get('gc_by_generation') or {}).get('uncollectable', [0]))}")
    if "rss_slope_mb_per_min" in s:
        print(f"soak RSS after warm-up: {s['rss_after_warmup_first_mb']:.1f} -> "
              f"{s['rss_after_warmup_last_mb']:.1f} MB (growth "
              f"{s['rss_growth_after_warmup_mb']:+.1f} MB, slope "
              f"{s['rss_slope_mb_per_min']:+.2f} MB/min over "
              f"{s['post_warmup_minutes']:.1f} min): "
              f"{'flat' if s['rss_flat'] else 'GROWING'} (rule: <= {s['rss_flat_rule_mb']:.1f} MB)")
    print(f"gateway RSS idle {res['rss_idle_mb']:.1f} MB, peak (VmHWM) "
          f"{res['gateway_peak_rss_mb']:.1f} MB, after {res['rss_after_mb']:.1f} MB")


if __name__ == "__main__":
    sys.exit(main())
