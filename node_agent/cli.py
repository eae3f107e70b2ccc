"""`meshroute node`: announce a shard over mDNS and/or register it with trackers over HTTP
(`--register`), optionally serving an emulated node too."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio

from meshroute_middleware.core import InvalidNodeError, NodeRecord, parse_node
from meshroute_middleware.core.capabilities import CAPABILITIES, parse_caps
from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.slot_count import slot_count

from .announcer import LOAD_POLL_S, NodeAnnouncer, Publisher, follow
from .emulator import EmulatedNode, EmulatorConfig, serve_node
from .load import LOAD_SOURCES, LoadReader
from .mdns import addresses_for, parse_interfaces
from .register import HttpRegistrar, parse_trackers
from .serving import ListenError, one_line

# option -> (environment variable, type); the CLI flag wins over the variable.
ENV: dict[str, tuple[str, type]] = {
    "model": ("MESHROUTE_NODE_MODEL", str), "shard": ("MESHROUTE_NODE_SHARD", str),
    "layers": ("MESHROUTE_NODE_LAYERS", int), "url": ("MESHROUTE_NODE_URL", str),
    "tps": ("MESHROUTE_NODE_TPS", float), "node_id": ("MESHROUTE_NODE_ID", str),
    "mdns_interfaces": ("MESHROUTE_MDNS_INTERFACES", str),
    "mesh_secret": ("MESHROUTE_MESH_SECRET", str),
    "load_from": ("MESHROUTE_NODE_LOAD_FROM", str),
    "caps": ("MESHROUTE_NODE_CAPS", str), "api_key_env": ("MESHROUTE_NODE_API_KEY_ENV", str),
    "slots": ("MESHROUTE_NODE_SLOTS", int),
    "register": ("MESHROUTE_NODE_REGISTER", str),  # comma-separated tracker URLs
    "node_token": ("MESHROUTE_NODE_TOKEN", str),  # the trackers' --node-token
}
EMULATOR_KNOBS: dict[str, tuple[type, str]] = {
    "seconds_per_layer": (float, "seconds of compute per layer per token"),
    "hop_latency_s": (float, "seconds of link latency per token into this hop"),
    # also the slot count any node announces (NodeSettings.slots), emulated or not
    "slots": (int, "requests served at once (the batch; more queue), announced as the "
                   "node's slots; for any server (vLLM --max-num-seqs, llama.cpp --parallel), "
                   "over what its /slots page says"),
    "slot_slowdown": (float, "per-token slowdown per extra request in the batch (0: free)"),
    "max_queue": (int, "requests that may queue before 503"),
    "noise_sigma": (float, "sigma of per-request log-normal noise on compute time"),
    "seed": (int, "seed of the noise and fault draws"),
    "fail_share": (float, "share of requests answered with 500"),
    "die_share": (float, "share of requests whose connection drops mid-stream"),
    "stall_share": (float, "share of requests that stall before the first token"),
    "stall_s": (float, "seconds a stalled request stalls"),
    "max_tokens_default": (int, "tokens generated when a request sets no max_tokens"),
    "prefill_tps": (float, "prompt tokens/s of the whole model (0: prompts cost nothing)"),
    "cache_tokens": (int, "prefix-cache capacity in tokens, LRU (0: no cache)"),
    "first_token_s": (float, "base latency before every first token"),
    "embedding_dim": (int, "length of the vectors /v1/embeddings answers (default 64)"),
}


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """What `meshroute node` runs: the record's fields, mDNS options, the emulator."""

    model: str
    start: int
    end: int
    layers: int
    url: str | None
    tps: float | None
    node_id: str | None
    mdns_interfaces: str
    mesh_secret: str | None
    emulate: bool
    host: str
    port: int
    knobs: dict[str, Any]
    load_from: str = "auto"  # where a real server's live load is read (node_agent/load.py)
    caps: frozenset[str] | None = None  # --caps; None: none declared (the defaults hold)
    # --api-key-env: the variable holding the fronted server's own key (vLLM --api-key),
    # sent on this agent's own probes of it; the tracker's forwarder is given it by the
    # tracker's own [[node_keys]] (docs/security.md): it never travels in a record.
    api_key: str | None = field(default=None, repr=False)
    # --slots: the slot count to announce (core/slot_count.py), over what the server's pages
    # say; None: the emulator's own (its `slots` knob) or the server's /slots, if any.
    slots: int | None = None
    # --register: trackers' base URLs to POST the record to (node_agent/register.py)
    register: tuple[str, ...] = ()
    node_token: str | None = field(default=None, repr=False)  # their --node-token
    mdns: bool = True  # --no-mdns: no mDNS announcement (HTTP registration only)
    # --no-continue: the server cannot continue a trailing assistant message (issue 34)
    continues: bool = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `meshroute node` (each also read from its MESHROUTE_* variable)."""
    parser.add_argument("--model", help="model id the node serves (emulator: emu-model)")
    parser.add_argument("--shard", help="layers served, START-END inclusive (e.g. 0-21)")
    parser.add_argument("--layers", type=int, help="the model's layer count (emulator: 32)")
    parser.add_argument("--url", help="base URL of the node's OpenAI-compatible server")
    parser.add_argument("--tps", type=float, help="advertised tokens/s of the shard")
    parser.add_argument("--node-id", help="stable node id (default: model, shard, address)")
    parser.add_argument("--mdns-interfaces", help="'all' (default) or comma-separated addresses")
    parser.add_argument("--mesh-secret", help="sign the record with this mesh secret")
    parser.add_argument("--load-from", choices=LOAD_SOURCES,
                        help="read the fronted server's live queue, speed, slots and cache "
                             "from its own pages (default auto: llama.cpp, vLLM, SGLang or "
                             "TGI, whichever answers)")
    parser.add_argument("--caps", help="what the node serves beyond plain chat, comma-separated "
                                       f"({', '.join(CAPABILITIES)}; default: tools,json_schema)")
    parser.add_argument("--api-key-env", help="environment variable holding the fronted "
                                              "server's own API key (vLLM --api-key)")
    parser.add_argument("--register", action="append", metavar="URL",
                        help="register with the tracker at this base URL over HTTP (POST "
                             "/v1/nodes, refreshed, DELETE on exit); repeatable or "
                             "comma-separated for several trackers (MESHROUTE_NODE_REGISTER)")
    parser.add_argument("--node-token", help="the trackers' --node-token, sent as a bearer "
                                             "token with --register (better: "
                                             "MESHROUTE_NODE_TOKEN, which ps does not show)")
    parser.add_argument("--mdns", action=argparse.BooleanOptionalAction, default=None,
                        help="announce over mDNS (default on; --no-mdns: only --register)")
    parser.add_argument("--continue", dest="continues", action=argparse.BooleanOptionalAction,
                        default=None, help="the server continues a trailing assistant message, "
                        "so answers broken mid-stream go on here (default on)")
    parser.add_argument("--emulate", action="store_true", help="also serve an emulated node")
    parser.add_argument("--host", default="127.0.0.1", help="emulator listen address")
    parser.add_argument("--port", type=int, default=0, help="emulator port (0: any free)")
    group = parser.add_argument_group("emulator knobs")
    for name, (kind, text) in EMULATOR_KNOBS.items():
        group.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=text)


def _shard(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if match is None:
        raise ValueError(f"--shard must look like START-END, got {text!r}")
    return int(match[1]), int(match[2])


def node_settings(cli: Mapping[str, Any], environ: Mapping[str, str]) -> NodeSettings:
    """Flags over MESHROUTE_* variables over defaults; ValueError names the bad value."""
    values = dict(cli)
    if isinstance(values.get("register"), list):  # the repeatable flag
        values["register"] = ",".join(values["register"]) or None
    for name, (var, kind) in ENV.items():
        if values.get(name) is None and environ.get(var):
            try:
                values[name] = kind(environ[var])
            except ValueError:
                raise ValueError(f"{var} must be {kind.__name__}, got {environ[var]!r}") from None
    emulate = bool(values.get("emulate"))
    whole = not emulate and values.get("layers") is None and values.get("shard") is None
    layers = values.get("layers") or (32 if emulate else 1 if whole else None)
    if values.get("model") is None and not emulate:
        raise ValueError("--model is required (or --emulate)")
    if layers is None or (values.get("shard") is None and not emulate and not whole):
        raise ValueError("--layers and --shard go together (neither: a whole-model server)")
    start, end = _shard(values["shard"]) if values.get("shard") else (0, layers - 1)
    if values.get("url") is None and not emulate:
        raise ValueError("--url is required without --emulate")
    parse_interfaces(values.get("mdns_interfaces") or "all")
    register = parse_trackers([values["register"]] if values.get("register") else [])
    mdns = values.get("mdns") is not False
    if not mdns and not register:
        raise ValueError("--no-mdns needs --register URL: nothing else would make the node "
                         "known to a tracker")
    load_from = values.get("load_from") or "auto"
    if load_from not in LOAD_SOURCES:
        raise ValueError(f"--load-from must be one of {', '.join(LOAD_SOURCES)}, "
                         f"got {load_from!r}")
    return NodeSettings(
        model=values.get("model") or "emu-model", start=start, end=end, layers=layers,
        url=values.get("url"), tps=values.get("tps"), node_id=values.get("node_id"),
        mdns_interfaces=values.get("mdns_interfaces") or "all",
        mesh_secret=values.get("mesh_secret"), emulate=emulate,
        host=values.get("host") or "127.0.0.1", port=int(values.get("port") or 0),
        knobs={k: values[k] for k in EMULATOR_KNOBS if values.get(k) is not None},
        load_from=load_from,
        caps=None if values.get("caps") is None else parse_caps(values["caps"], "--caps"),
        api_key=_api_key(values.get("api_key_env"), environ),
        slots=None if values.get("slots") is None else slot_count(values["slots"], "--slots"),
        register=register, node_token=values.get("node_token") or None, mdns=mdns,
        continues=values.get("continues") is not False)


def _api_key(name: str | None, environ: Mapping[str, str]) -> str | None:
    """The key held by the variable --api-key-env names; ValueError (naming the variable,
    never a value) when it is unset."""
    if name is None:
        return None
    if not environ.get(name, "").strip():
        raise ValueError(f"--api-key-env {name}: the environment variable is not set or empty")
    return environ[name].strip()


def default_node_id(s: NodeSettings, where: str) -> str:
    """`model-start-end@where`, with characters a node id may not hold replaced."""
    return re.sub(r"[^A-Za-z0-9._:@/+-]", "_", f"{s.model}-{s.start}-{s.end}@{where}")[:128]


def emulator_config(s: NodeSettings) -> EmulatorConfig:
    """The emulator's config from the settings."""
    where = f"{socket.gethostname()}:{s.port}" if s.port else f"pid{os.getpid()}"
    return EmulatorConfig(node_id=s.node_id or default_node_id(s, where), model=s.model,
                          start=s.start, end=s.end, layers=s.layers, tps=s.tps, **s.knobs)


def node_record(s: NodeSettings, url: str, node_id: str | None, tps: float,
                slots: int | None = None) -> NodeRecord:
    """The validated record to announce; InvalidNodeError says what is wrong."""
    where = urlsplit(url).netloc
    return parse_node({"node_id": node_id or s.node_id or default_node_id(s, where),
                       "model": s.model, "start": s.start, "end": s.end, "layers": s.layers,
                       "url": url, "tps": tps,
                       "caps": None if s.caps is None else sorted(s.caps), "slots": slots,
                       "continues": s.continues})


def reachable_url(url: str, interfaces: str) -> str:
    """A listen URL on 0.0.0.0 or :: as others reach it: the address mDNS publishes."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host not in ("0.0.0.0", "::"):
        return url
    address = addresses_for(host, interfaces)[0]
    address = f"[{address}]" if ":" in address else address
    return f"{parts.scheme}://{address}:{parts.port}"


class StartError(MeshRouteError):
    """The node could not start (its emulator or its mDNS announcement); one line."""


async def _serve(s: NodeSettings) -> int:
    async with AsyncExitStack() as stack:
        node: EmulatedNode | None = None
        url, node_id, tps, slots = s.url, s.node_id, s.tps or 10.0, s.slots
        if s.emulate:
            config = emulator_config(s)
            try:
                served, own_url = await stack.enter_async_context(
                    serve_node(config, s.host, s.port))
            except ListenError:
                raise
            except Exception as exc:
                raise StartError(f"the emulator cannot start: {one_line(exc)}") from exc
            node, url, node_id, tps = (served, url or reachable_url(own_url, s.mdns_interfaces),
                                       config.node_id, served.measured_tps)
            slots = config.slots
        assert url is not None
        record = node_record(s, url, node_id, tps, slots)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            publishers = await _publish(s, record, stack)
            async with anyio.create_task_group() as tg:
                for publisher in publishers:
                    if isinstance(publisher, HttpRegistrar):
                        tg.start_soon(publisher.run)
                if node is not None:
                    emulated = node
                    tg.start_soon(follow, publishers,
                                  lambda: (emulated.queue_depth, emulated.measured_tps))
                elif s.load_from != "none":  # a real server: its own metrics are the prior
                    reader = LoadReader(url, s.load_from, tps, api_key=s.api_key)
                    tg.start_soon(reader.run)
                    # an operator's --slots wins over what the server's pages say
                    tg.start_soon(follow, publishers, reader.announcement, LOAD_POLL_S,
                                  reader.cache_prior,
                                  reader.slot_count if s.slots is None else None,
                                  reader.held)
                async for signum in signals:
                    print(f"meshroute node: {signal.Signals(signum).name}: saying goodbye",
                          flush=True)
                    tg.cancel_scope.cancel()
                    break
    return 0


async def _publish(s: NodeSettings, record: NodeRecord,
                   stack: AsyncExitStack) -> list[Publisher]:
    """Start what makes the record known (mDNS, then each --register tracker), each closed
    with `stack` (the goodbye, the DELETE); StartError when mDNS cannot announce."""
    publishers: list[Publisher] = []
    if s.mdns:
        announcer = NodeAnnouncer(record, interfaces=s.mdns_interfaces,
                                  mesh_secret=s.mesh_secret)
        try:
            await announcer.start()
        except Exception as exc:
            raise StartError(f"cannot announce over mDNS: {one_line(exc)}") from exc
        stack.push_async_callback(announcer.close)
        publishers.append(announcer)
        print(f"meshroute node: announced {record.node_id} ({record.model} layers "
              f"{record.start}-{record.end} of {record.layers}) at {record.url} "
              f"on mDNS interfaces {s.mdns_interfaces}", flush=True)
    if s.register:
        registrar = HttpRegistrar(record, s.register, token=s.node_token)
        stack.push_async_callback(registrar.close)
        await registrar.start()
        publishers.append(registrar)
        print(f"meshroute node: registering {record.node_id} ({record.model} layers "
              f"{record.start}-{record.end} of {record.layers}) at {record.url} with "
              f"{', '.join(s.register)} over HTTP", flush=True)
    return publishers


def run(args: argparse.Namespace) -> int:
    """Entry point of `meshroute node`."""
    try:
        settings = node_settings(vars(args), os.environ)
        return anyio.run(_serve, settings)
    except ListenError as exc:
        print(f"meshroute node: {exc.strerror}; choose another port with --port (0: any free "
              "port)", file=sys.stderr)
        return 2
    except (ValueError, InvalidNodeError, StartError) as exc:
        print(f"meshroute node: {exc}", file=sys.stderr)
        return 2
