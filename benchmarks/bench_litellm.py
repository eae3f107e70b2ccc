"""meshroute's gateway side by side with LiteLLM's proxy: same emulated backend, same load,
same run, one network namespace.

  scripts/isolated python benchmarks/bench_litellm.py [--seconds 5] [--rounds 3]
      [--streams 100,1000] [--stream-seconds 30] [--json PATH]

(re-runs itself under scripts/isolated when not already inside a namespace of its own: LiteLLM
runs with no network but loopback, so its backend and the load generator live there too.)
LiteLLM's proxy comes from its own venv (`benchmarks/litellm-venv` builds it once), started
as measured here: `litellm --config cfg.yaml --host 127.0.0.1 --port P --num_workers 1` with
LITELLM_MASTER_KEY, LITELLM_LOCAL_MODEL_COST_MAP=True and LITELLM_OFFLINE_MODE=true, access
log off (as `meshroute serve --log-level warning` has it). Both gateways get the same two
`meshroute node --emulate` backends (`fast`: 16 tokens at once; `paced`: --stream-tps tokens/s
per stream) and every request carries the same bearer token. Phases, each target in turn:
wrk -t1 at c=1 and c=32 (--rounds interleaved, median), then N held SSE streams.
CPU per request: the server's utime+stime (/proc/PID/stat, children included) over the phase
divided by the requests it completed; RSS: statm after start-up, VmHWM at the end.

With `--keyed plain|limits` (issue 32, "the side-by-side table with a key configured") a
second meshroute gateway, "meshroute keyed", runs beside the first on the same backends with
one `[[clients]]` client whose key is the bearer token every request carries (LiteLLM's
master key), without limits (`plain`) or with rpm, tpm, daily_tokens and monthly_usd set
high enough never to refuse (`limits`), in this process's memory (no state file). LiteLLM's
own keyed mode, virtual keys with budgets, needs its Postgres database (`DATABASE_URL`),
which does not run here: it is measured with its master key, which every request presents
(its proxy refuses to start without one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _load as L
from benchmarks import _procs as P

KEY = "sk-bench-not-a-secret"
KEYED = "meshroute keyed"  # the target of --keyed
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}
# uvicorn's logging with the access log off: LiteLLM logs one INFO line per request otherwise.
LOG_CONFIG = {"version": 1, "disable_existing_loggers": False,
              "handlers": {"err": {"class": "logging.StreamHandler"}},
              "root": {"level": "WARNING", "handlers": ["err"]},
              "loggers": {"uvicorn.access": {"level": "WARNING"}}}


Targets = tuple[tuple[str, int], tuple[str, int]]  # (non-streaming, SSE) x (url, server pid)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5, help="wrk run length")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", default="1,32", help="wrk connection counts")
    p.add_argument("--streams", default="100,1000", help="SSE stream counts to hold")
    p.add_argument("--stream-seconds", type=float, default=30)
    p.add_argument("--stream-tps", type=float, default=1.0, help="tokens/s of one stream")
    p.add_argument("--stream-tokens", type=int, default=15, help="tokens per stream")
    p.add_argument("--stream-timeout", type=float, default=120, help="seconds, per stream")
    p.add_argument("--keyed", choices=("none", "plain", "limits"), default="none",
                   help="also run a meshroute gateway with a [[clients]] key (see above)")
    p.add_argument("--json", default=str(P.ROOT / "benchmarks/results/litellm.json"))
    p.add_argument("--no-isolate", action="store_true", help="don't re-run in scripts/isolated")
    return p.parse_args()


def litellm_venv() -> Path:
    """The LiteLLM venv, built by benchmarks/litellm-venv on first use."""
    out = subprocess.run([str(P.ROOT / "benchmarks/litellm-venv")], check=True,
                         capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def start_litellm(procs: P.Procs, venv: Path, models: dict[str, str],
                  workdir: Path) -> tuple[str, int]:
    """LiteLLM's proxy with one model_list entry per {model: backend url}; (url, pid)."""
    entries = "".join(f"  - model_name: {m}\n    litellm_params:\n      model: openai/{m}\n"
                      f"      api_base: {url}/v1\n      api_key: none\n"
                      for m, url in models.items())
    (workdir / "cfg.yaml").write_text("model_list:\n" + entries)
    (workdir / "log.json").write_text(json.dumps(LOG_CONFIG))
    port = P.free_port()
    env = {"LITELLM_MASTER_KEY": KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "LITELLM_OFFLINE_MODE": "true", "LITELLM_LOG": "ERROR"}
    proc = procs.start([str(venv / "bin/litellm"), "--config", str(workdir / "cfg.yaml"),
                        "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1",
                        "--log_config", str(workdir / "log.json")], env=env,
                       log=workdir / "litellm.log")
    url = f"http://127.0.0.1:{port}"
    P.wait_http(url + "/health/liveliness", proc, timeout_s=180)
    return url, proc.pid


def client_config(keyed: str, path: Path) -> Path:
    """A config with one `[[clients]]` client whose key is KEY (its digest), with every limit
    set high enough never to refuse when `keyed` is "limits"."""
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    limits = ("rpm = 1000000000\ntpm = 1000000000000\ndaily_tokens = 1000000000000\n"
              "monthly_usd = 1000000000000.0\n") if keyed == "limits" else ""
    path.write_text(f'[[clients]]\nname = "bench"\nkey = "sha256:{digest}"\n{limits}')
    return path


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    streams = [int(x) for x in args.streams.split(",") if x]
    slots = max(streams) + 64
    venv = litellm_venv()
    with P.processes() as procs:
        fast, fast_pid = P.start_emulator(procs, "fast-0", "fast", 1e6, 64, 4096,
                                          tmp / "fast.log")
        paced, paced_pid = P.start_emulator(procs, "paced-0", "paced", args.stream_tps,
                                            slots, 4 * slots, tmp / "paced.log")
        gw, gw_pid = P.start_gateway(procs, {"fast-0": ("fast", fast),
                                             "paced-0": ("paced", paced)}, tmp / "gw.log")
        targets = {"direct": ((fast, fast_pid), (paced, paced_pid)),
                   "meshroute": ((gw, gw_pid), (gw, gw_pid))}
        if args.keyed != "none":
            env = {"MESHROUTE_CONFIG": str(client_config(args.keyed, tmp / "keyed.toml"))}
            kw, kw_pid = P.start_gateway(procs, {"fast-0": ("fast", fast),
                                                 "paced-0": ("paced", paced)},
                                         tmp / "gw-keyed.log", extra_env=env)
            targets[KEYED] = ((kw, kw_pid), (kw, kw_pid))
        lt, lt_pid = start_litellm(procs, venv, {"fast": fast, "paced": paced}, tmp)
        targets["litellm"] = ((lt, lt_pid), (lt, lt_pid))
        out: dict[str, Any] = {"rss_idle_mb": {name: P.rss_mb(pid) for name, ((_, pid), _)
                                               in targets.items() if name != "direct"},
                               "keyed": args.keyed}
        for name, ((url, _), _) in targets.items():  # warm-up, not recorded
            print(f"warm-up {name}", file=sys.stderr, flush=True)
            await L.wrk(url + "/v1/chat/completions", json.dumps(CHAT), 8, 2, AUTH, 30)
        out["nonstream"] = await nonstream(args, targets)
        out["sse"] = await sse(args, streams, targets)
        out["peak_rss_mb"] = {name: P.hwm_mb(pid) for name, ((_, pid), _) in targets.items()
                              if name != "direct"}
        out["litellm_version"] = subprocess.run(
            [str(venv / "bin/python"), "-c",
             "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True, text=True).stdout.strip()
    return out


async def nonstream(args: argparse.Namespace,
                    targets: dict[str, Targets]) -> dict[str, Any]:
    conns = [int(x) for x in args.connections.split(",") if x]
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for c in conns:
            for name, ((url, pid), _) in targets.items():
                print(f"non-streaming round {r + 1}/{args.rounds} c={c} {name}",
                      file=sys.stderr, flush=True)
                res = await L.measure(L.wrk(url + "/v1/chat/completions", json.dumps(CHAT), c,
                                            args.seconds, AUTH, 30), pid)
                res["cpu_us_per_request"] = res["server_cpu_s"] * 1e6 / max(res["requests"], 1)
                runs.setdefault(f"{name} c={c}", []).append(res)
    out: dict[str, Any] = {}
    for key, rs in runs.items():
        out[key] = L.median_of(rs)
        out[key]["errors"] = sum(r["errors"] for r in rs)
    for c in conns:
        d, m, lt = out[f"direct c={c}"], out[f"meshroute c={c}"], out[f"litellm c={c}"]
        added = {n: {q: t[f"{q}_ms"] - d[f"{q}_ms"] for q in ("p50", "p95", "p99")}
                 for n, t in (("meshroute", m), ("litellm", lt))}
        ratios = out[f"ratio c={c}"] = {
            "rps_meshroute_over_litellm": _over(m["rps"], lt["rps"]),
            "rps_meshroute_over_direct": _over(m["rps"], d["rps"]),
            "rps_litellm_over_direct": _over(lt["rps"], d["rps"]),
            "added_ms": added,
            **{f"added_{q}_litellm_over_meshroute": _over(added["litellm"][q],
                                                          added["meshroute"][q])
               for q in ("p50", "p99")},
            "cpu_per_request_litellm_over_meshroute":
                _over(lt["cpu_us_per_request"], m["cpu_us_per_request"])}
        k = out.get(f"{KEYED} c={c}")
        if k is not None:  # the keyed gateway against LiteLLM (keyed too) and unkeyed
            added_k = {q: k[f"{q}_ms"] - d[f"{q}_ms"] for q in ("p50", "p95", "p99")}
            ratios.update({
                "rps_keyed_over_litellm": _over(k["rps"], lt["rps"]),
                "rps_keyed_over_unkeyed": _over(k["rps"], m["rps"]),
                "added_ms_keyed": added_k,
                **{f"added_{q}_litellm_over_keyed": _over(added["litellm"][q], added_k[q])
                   for q in ("p50", "p99")},
                "cpu_per_request_litellm_over_keyed":
                    _over(lt["cpu_us_per_request"], k["cpu_us_per_request"]),
                "cpu_per_request_keyed_over_unkeyed":
                    _over(k["cpu_us_per_request"], m["cpu_us_per_request"])})
    return out


async def sse(args: argparse.Namespace, streams: list[int],
              targets: dict[str, Targets]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    body = {"model": "paced", "stream": True, "max_tokens": args.stream_tokens,
            "messages": [{"role": "user", "content": "hi"}]}
    ramp = min(args.stream_tokens / args.stream_tps, args.stream_seconds / 3)
    for n in streams:
        for name, (_, (url, pid)) in targets.items():
            print(f"SSE: holding {n} streams, {name}, for {args.stream_seconds} s",
                  file=sys.stderr, flush=True)
            sampler = P.RssSampler({name: pid}, 1.0)
            with sampler:
                res = await L.measure(L.hold_streams(
                    url + "/v1/chat/completions", body, n, args.stream_seconds, ramp, AUTH,
                    args.stream_timeout), pid)
            res["rss_max_mb"] = max((s[name] for _, s in sampler.samples), default=0.0)
            res["cpu_us_per_stream"] = res["server_cpu_s"] * 1e6 / max(res["streams_ok"], 1)
            res["cpu_us_per_chunk"] = res["server_cpu_s"] * 1e6 / max(res["chunks"], 1)
            out[f"{name} {n} streams"] = res
        d, m, lt = (out[f"{t} {n} streams"] for t in ("direct", "meshroute", "litellm"))
        out[f"ratio {n} streams"] = {
            "streams_ok_meshroute_over_litellm": m["streams_ok"] / max(lt["streams_ok"], 1),
            "chunks_per_s_meshroute_over_litellm": _over(m["chunks_per_s"],
                                                          lt["chunks_per_s"]),
            "added_ttft_p50_ms": {t: out[f"{t} {n} streams"]["ttft_p50_ms"] - d["ttft_p50_ms"]
                                  for t in targets if t != "direct"},
            "added_ttft_p99_ms": {t: out[f"{t} {n} streams"]["ttft_p99_ms"] - d["ttft_p99_ms"]
                                  for t in targets if t != "direct"},
            "cpu_per_stream_litellm_over_meshroute":
                _over(lt["cpu_us_per_stream"], m["cpu_us_per_stream"])}
    return out


def main() -> int:
    return P.run_bench(__file__, parse_args(), run, report)


def report(res: dict[str, Any]) -> None:
    meta = res["meta"]
    print(f"\nlitellm {res['litellm_version']}; load average before/after: "
          f"{meta['load_average_before']} / {meta['load_average_after']}")
    print("\n| case | req/s | p50 ms | p95 ms | p99 ms | errors | server CPU µs/req |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for key, r in res["nonstream"].items():
        if not key.startswith("ratio"):
            print(f"| {key} | {r['rps']:,.1f} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | "
                  f"{r['p99_ms']:.2f} | {r['errors']} | {r['cpu_us_per_request']:,.0f} |")
    for key, r in res["nonstream"].items():
        if key.startswith("ratio"):
            print(f"{key}: {json.dumps(_rounded(r))}")
    print("\n| case | held (peak) | ok | failed | chunks/s | TTFT p50 ms | p99 ms | "
          "CPU µs/stream | RSS max MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, r in res["sse"].items():
        if not key.startswith("ratio"):
            print(f"| {key} | {r['peak_open_streams']} | {r['streams_ok']} | "
                  f"{r['streams_failed']} | {r['chunks_per_s']:,.0f} | {r['ttft_p50_ms']:.1f} | "
                  f"{r['ttft_p99_ms']:.1f} | {r['cpu_us_per_stream']:,.0f} | "
                  f"{r['rss_max_mb']:.0f} |")
            if r["errors"]:
                print(f"  errors: {r['errors']}")
    for key, r in res["sse"].items():
        if key.startswith("ratio"):
            print(f"{key}: {json.dumps(_rounded(r))}")
    print(f"RSS idle {res['rss_idle_mb']}, peak {res['peak_rss_mb']} (MB)")


def _over(a: float, b: float) -> float | None:
    """a / b, or None where b is not positive (an added latency lost in the noise, or a
    phase too short for a single answer)."""
    return a / b if b > 0 else None


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 3) if isinstance(value, float) else value


if __name__ == "__main__":
    sys.exit(main())
