"""Coverage-guided fuzzing (atheris) of meshroute's hostile-input parsers; not a pytest suite.

  python fuzz/harness.py TARGET CORPUS_DIR fuzz/seeds/TARGET [-max_total_time=60 ...]

TARGET is one of: request, node, txt, gossip, providers. Each target feeds the fuzzer's bytes
to one parser and fails (atheris reports the input and a crash file) on any exception other
than the parser's documented refusal. Needs atheris in a venv of its own (see fuzz/README.md).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports():
    import msgpack

    from gossip.errors import GossipError
    from gossip.wire import WIRE_VERSION, WireCodec
    from meshroute_middleware.core import InvalidNodeError, parse_node
    from meshroute_middleware.core.contracts import txt
    from meshroute_middleware.core.providers.config import (
        ProviderConfigError,
        parse_providers_config,
    )
    from meshroute_middleware.http.request import RequestError, parse_chat

NOW = 1_000_000.0


def _json(data: bytes) -> object:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def request(data: bytes) -> None:
    try:
        req = parse_chat(data)
    except RequestError as exc:
        assert exc.status == 400
        return
    assert req.model and isinstance(req.model, str)


def node(data: bytes) -> None:
    value = _json(data)
    try:
        record = parse_node(value if isinstance(value, dict) else {"raw": value})  # type: ignore[arg-type]
    except InvalidNodeError:
        return
    assert 0 <= record.start <= record.end < record.layers and record.tps > 0


def txt_record(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    props: dict[object, object] = {}
    for _ in range(fdp.ConsumeIntInRange(0, 14)):
        key = fdp.PickValueInList([b"v", b"id", b"m", b"s", b"e", b"l", b"u", b"t", b"q", b"r",
                                   b"hp", b"gp", fdp.ConsumeBytes(4)])
        props[key] = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
    with contextlib.suppress(InvalidNodeError):
        txt.decode_node(props)
    with contextlib.suppress(txt.TxtError):
        txt.decode_tracker(props)


_CODEC = WireCodec("me")


def gossip(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    raw = fdp.ConsumeBool()
    rest = fdp.ConsumeBytes(len(data))
    frame = rest if raw else msgpack.packb([WIRE_VERSION, 2, "peer", NOW, 1, 0, rest, None])
    with contextlib.suppress(GossipError):
        _CODEC.decode(frame, NOW)


def providers(data: bytes) -> None:
    value = _json(data)
    if not isinstance(value, dict):
        return
    with contextlib.suppress(ProviderConfigError):
        parse_providers_config(value)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "request": request, "node": node, "txt": txt_record, "gossip": gossip,
    "providers": providers}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: harness.py {{{','.join(TARGETS)}}} [libFuzzer options]")
    target = TARGETS[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
