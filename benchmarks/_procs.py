"""Processes of the load benchmarks: servers started through the command line, /proc readings.

Everything is driven through `meshroute`'s command line and HTTP (no package imports), on
127.0.0.1. Used by bench_load.py and bench_litellm.py (through _load.py for the load itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def meshroute_cmd() -> list[str]:
    """The `meshroute` command of this interpreter's environment."""
    script = Path(PY).parent / "meshroute"
    return [str(script)] if script.exists() else [PY, "-m", "meshroute_middleware.cli"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def pin_split() -> tuple[set[int], set[int]]:
    """For `--pin`: (the gateway's CPUs, everyone else's): the last CPU this process may use
    for the gateway alone, the others for the load generator, the nodes and the tools. Then a
    stall the gateway's loop shows is its own work (or another program's on the machine), not
    time it waited while the load generator held its core."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError(f"--pin needs two CPUs, this process may use {cpus}")
    return {cpus[-1]}, set(cpus[:-1])


def pin_self(cpus: set[int]) -> None:
    """Keep this process (the load generator) and what it starts from now on `cpus`."""
    os.sched_setaffinity(0, cpus)


def load_average() -> tuple[float, float, float]:
    """The machine's 1, 5 and 15 minute load averages."""
    return os.getloadavg()


# -- /proc ---------------------------------------------------------------------------------
def tree_pids(pid: int) -> list[int]:
    """`pid` and all its descendants (a server that forks workers counts as a whole)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used by `pid` and its descendants (Linux /proc)."""
    total = 0.0
    for p in tree_pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its descendants, MB."""
    total_kb = 0
    for p in tree_pids(pid):
        try:
            total_kb += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE_KB
        except (OSError, IndexError):
            continue
    return total_kb / 1024


def hwm_mb(pid: int) -> float:
    """Peak resident memory (VmHWM) of `pid` and its descendants, MB."""
    total_kb = 0
    for p in tree_pids(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return total_kb / 1024


class RssSampler:
    """Samples the RSS of some processes every `interval_s` in a thread: (t, {name: MB})."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.5) -> None:
        self.pids, self.interval_s = pids, interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), {n: rss_mb(p) for n, p in self.pids.items()}))
            self._stop.wait(self.interval_s)

    def window(self, name: str, t0: float, t1: float) -> list[tuple[float, float]]:
        """(t, MB) of `name` between t0 and t1."""
        return [(t, s[name]) for t, s in self.samples if t0 <= t <= t1 and name in s]


# -- processes -------------------------------------------------------------------------------
@dataclass
class Procs:
    """Servers started for a run; all terminated (then killed) on exit."""

    running: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, cmd: list[str], env: dict[str, str] | None = None,
              log: Path | None = None, cpus: set[int] | None = None) -> subprocess.Popen[bytes]:
        """Start `cmd`; with `cpus`, on those CPUs only (its threads and children too)."""
        out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - lives with proc
        if cpus:
            cmd = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *cmd]
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})},
                                stdout=out, stderr=subprocess.STDOUT)
        self.running.append(proc)
        return proc

    def stop(self) -> None:
        stop(self.running)


def stop(procs: Iterable[subprocess.Popen[Any]], wait_s: float = 15.0) -> None:
    """Stop processes the way a user would, all at once: SIGTERM to every one still running,
    then wait for each (its graceful shutdown, `wait_s`); one still running after that is
    killed. The one copy of this rule: benchmarks, and tests (tests/engines,
    tests/node_agent) import it from here (tests may import benchmarks; not the reverse)."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


@contextmanager
def processes() -> Iterator[Procs]:
    """A Procs whose servers stop when the block ends, however it ends."""
    procs = Procs()
    try:
        yield procs
    finally:
        procs.stop()


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 90.0,
              headers: dict[str, str] | None = None) -> None:
    """Wait until GET `url` answers (any status); fail early if `proc` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                   timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout_s} s")


def start_emulator(procs: Procs, node_id: str, model: str, tps: float, slots: int,
                   max_queue: int, log: Path | None = None) -> tuple[str, int]:
    """`meshroute node --emulate` serving `model` at `tps` tokens/s per request; (url, pid)."""
    port = free_port()
    proc = procs.start([*meshroute_cmd(), "node", "--emulate", "--port", str(port),
                        "--node-id", node_id, "--model", model, "--tps", str(tps),
                        "--slots", str(slots), "--max-queue", str(max_queue),
                        "--mdns-interfaces", "127.0.0.1"], log=log)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/v1/models", proc)
    return url, proc.pid


HOOKS = Path(__file__).with_name("_hooks")
GATEWAY_MAX_CONNECTIONS = 2048


def start_gateway(procs: Procs, nodes: dict[str, tuple[str, str]], log: Path | None = None,
                  hook_out: Path | None = None, gc_threshold: str | None = None,
                  gc_freeze_after_s: float | None = None,
                  max_connections: int = GATEWAY_MAX_CONNECTIONS,
                  cpus: set[int] | None = None, gc_refreeze: bool = False,
                  extra_env: dict[str, str] | None = None) -> tuple[str, int]:
    """`meshroute serve` with each node {node_id: (model, url)} registered; (url, pid).
    `--max-connections` is raised above the default (512, app/edge.py) so that 1,000 held
    streams fit: the benchmarks measure the gateway's capacity, not that guard.
    With `hook_out`, the gateway runs with benchmarks/_hooks on its PYTHONPATH, which logs
    its event loop's lag and its GC pauses to that file (see _hooks/sitecustomize.py).
    With `cpus`, it runs on those CPUs only (`--pin`)."""
    port = free_port()
    env = dict(extra_env or {})
    if hook_out is not None:
        path = os.pathsep.join(x for x in (str(HOOKS), os.environ.get("PYTHONPATH")) if x)
        env.update({"PYTHONPATH": path, "MESHROUTE_BENCH_HOOK_OUT": str(hook_out)})
        if gc_threshold:
            env["MESHROUTE_BENCH_GC_THRESHOLD"] = gc_threshold
        if gc_refreeze:
            env["MESHROUTE_BENCH_GC_REFREEZE"] = "1"
        if gc_freeze_after_s is not None:
            env["MESHROUTE_BENCH_GC_FREEZE_AFTER_S"] = str(gc_freeze_after_s)
    proc = procs.start([*meshroute_cmd(), "serve", "--port", str(port), "--no-mdns",
                        "--log-level", "warning", "--max-connections", str(max_connections)],
                       env=env, log=log, cpus=cpus)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc)
    for node_id, (model, node_url) in nodes.items():
        record = {"node_id": node_id, "model": model, "start": 0, "end": 31, "layers": 32,
                  "url": node_url}
        req = urllib.request.Request(url + "/v1/nodes", data=json.dumps(record).encode(),
                                     headers={"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=10).close()
    return url, proc.pid


@contextmanager
def py_spy(pid: int | None, outdir: str | None, name: str, seconds: float) -> Iterator[None]:
    """With a pid and an output folder: `py-spy record` that process (collapsed stacks,
    idle frames left out) for `seconds` while the block runs."""
    if pid is None or outdir is None:
        yield
        return
    Path(outdir).mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen([str(Path(PY).parent / "py-spy"), "record", "--pid", str(pid),
                            "--duration", str(int(seconds)), "--rate", "200", "--format", "raw",
                            "--output", str(Path(outdir) / f"{name}.txt")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.wait(seconds + 30)


def run_bench(script: str, args: argparse.Namespace,
              run: Callable[[argparse.Namespace, Path], Coroutine[Any, Any, dict[str, Any]]],
              report: Callable[[dict[str, Any]], None]) -> int:
    """A wrk-driven benchmark's main: re-run itself inside `scripts/isolated` (unless
    --no-isolate), run `run` in a scratch directory (its processes' logs are printed if it
    fails), add the run's metadata (command, date, load average, fd limit) and write the JSON
    to `args.json`, then `report` it."""
    if os.environ.get("MESHROUTE_ISOLATED") != "1" and not args.no_isolate:
        isolated = str(ROOT / "scripts/isolated")
        os.execv(isolated, [isolated, PY, *sys.argv])
    if not shutil.which("wrk"):
        print("wrk is needed: apt-get install -y wrk", file=sys.stderr)
        return 2
    fds = raise_fd_limit()
    load_before = load_average()
    began = time.time()
    with tempfile.TemporaryDirectory(prefix=f"{Path(script).stem}-") as tmp:
        try:
            results = asyncio.run(run(args, Path(tmp)))
        except Exception:
            for log in sorted(Path(tmp).glob("*.log")):
                print(f"--- {log.name}\n{log.read_text()[-3000:]}", file=sys.stderr)
            raise
    results["meta"] = {
        "command": f"scripts/isolated python benchmarks/{Path(script).name} "
                   + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(began)),
        "seconds": time.time() - began, "load_average_before": load_before,
        "load_average_after": load_average(), "fd_limit": fds, "cpus": os.cpu_count(),
        "args": vars(args)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    report(results)
    return 0
