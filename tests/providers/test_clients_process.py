"""Client keys (issue 24) on a real `meshroute serve` with the official openai client: 401
missing and invalid, 403 model_not_allowed, a good key served (Bearer and x-api-key), the
key reaching neither an emulated node nor a fake provider nor the log, and `meshroute keys
new` output pasted into the config working as it is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from node_agent.emulator import EmulatedNode, EmulatorConfig

from ..upstream import ServerThread, serve_process
from .fake_provider import FakeProvider
from .gateway import ENV, HI

ALICE_KEY = "mr-alice-test-key-0123456789abcdef"


def providers_toml(fast: FakeProvider, slow: FakeProvider) -> str:
    return f"""
[routing]
chain = ["fastco/big-model", "slowco/small-model"]

[profiles.coding]
chain = ["slowco/small-model"]

[[providers]]
name = "fastco"
base_url = "{fast.base_url}"
keys = ["env:FAST_A", "env:FAST_B"]

[[providers.models]]
id = "big-model"
tier = "large"
context = 4096

[[providers]]
name = "slowco"
base_url = "{slow.base_url}"
keys = ["env:SLOW_A"]

[[providers.models]]
id = "small-model"
tier = "small"
context = 2048
"""


ALICE = """
[[clients]]
name = "alice"
key = "env:ALICE_KEY"
models = ["auto", "emu-model", "fastco/*"]
"""


class Recording:
    """An ASGI app's requests' headers (health probes too), kept as they arrived."""

    def __init__(self, app: ASGIApp) -> None:
        self.app, self.headers = app, list[list[tuple[bytes, bytes]]]()
        self.chats = 0  # POSTs of chat completions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.headers.append(list(scope["headers"]))
            self.chats += scope["method"] == "POST"
        await self.app(scope, receive, send)


@pytest.fixture
def node() -> Iterator[tuple[str, Recording]]:
    """An emulated node of `emu-model` (all 32 layers) on loopback, its requests recorded."""
    recording = Recording(EmulatedNode(EmulatorConfig(seconds_per_layer=0.0)).app())
    with ServerThread(recording) as server:
        yield server.url, recording


def keys_new(name: str) -> tuple[str, str]:
    """`meshroute keys new NAME`: its output, and the key in it."""
    proc = subprocess.run([sys.executable, "-m", "meshroute_middleware.app.cli", "keys", "new",
                           name], capture_output=True, text=True, timeout=60, check=True)
    match = re.search(r"^#\s+(mr-\S+)$", proc.stdout, re.M)
    assert match is not None, proc.stdout
    return proc.stdout, match.group(1)


def test_client_keys_with_the_openai_client(
        providers: tuple[FakeProvider, FakeProvider], node: tuple[str, Recording],
        tmp_path: Path) -> None:
    fast, slow = providers
    node_url, recording = node
    bob_lines, bob_key = keys_new("bob")
    assert bob_key not in bob_lines.split("[[clients]]")[1]  # only its sha256 is configured
    config, log = tmp_path / "meshroute.toml", tmp_path / "log"
    config.write_text(providers_toml(fast, slow) + ALICE + bob_lines)
    flags = ["--config", str(config), "--state-file", ":memory:", "--log-level", "debug"]
    with serve_process(flags, log, {**ENV, "ALICE_KEY": ALICE_KEY}) as (url, _):
        registered = httpx.post(f"{url}/v1/nodes", json={
            "node_id": "emu-0", "model": "emu-model", "start": 0, "end": 31, "layers": 32,
            "url": node_url, "tps": 50.0})
        assert registered.status_code in (200, 201), registered.text

        def client(key: str) -> openai.OpenAI:
            return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)

        missing = httpx.post(f"{url}/v1/chat/completions", json={"model": "auto",
                                                                  "messages": HI})
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "missing_api_key"
        with pytest.raises(openai.AuthenticationError) as no_key:  # the header left out
            client("unsent").chat.completions.create(
                model="auto", messages=HI,  # type: ignore[arg-type]
                extra_headers={"Authorization": openai.Omit()})  # type: ignore[dict-item]
        assert no_key.value.code == "missing_api_key"
        with pytest.raises(openai.AuthenticationError) as wrong:
            client(ALICE_KEY + "x").chat.completions.create(
                model="auto", messages=HI)  # type: ignore[arg-type]
        assert wrong.value.code == "invalid_api_key"
        assert wrong.value.type == "authentication_error"
        alice = client(ALICE_KEY)
        for model in ("slowco/small-model", "auto:coding", "auto:fastest", "qwen"):
            with pytest.raises(openai.PermissionDeniedError) as denied:
                alice.chat.completions.create(model=model, messages=HI)  # type: ignore[arg-type]
            assert denied.value.code == "model_not_allowed", model
            assert denied.value.type == "permission_error"
        assert fast.seen == [] and slow.seen == [] and recording.chats == 0
        # allowed by name: `auto`'s chain is allowed as a whole, slowco (which alice may not
        # ask for by name) one of its routes: whichever the strategy ranks first answers
        auto = alice.chat.completions.with_raw_response.create(
            model="auto", messages=HI)  # type: ignore[arg-type]
        assert auto.headers["x-meshroute-route"].split("#")[0] in {"fastco/big-model",
                                                                    "slowco/small-model"}
        stream = alice.chat.completions.create(model="fastco/big-model", messages=HI,
                                               stream=True)  # type: ignore[arg-type]
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        mesh = alice.chat.completions.with_raw_response.create(
            model="emu-model", messages=HI)  # type: ignore[arg-type]
        assert mesh.headers["x-meshroute-route"] == "emu-model|emu-0[0-31]"
        assert mesh.parse().choices[0].message.content
        # x-api-key works as well as Authorization: Bearer
        by_header = httpx.post(f"{url}/v1/chat/completions", headers={"x-api-key": ALICE_KEY},
                               json={"model": "emu-model", "messages": HI}, timeout=30)
        assert by_header.status_code == 200, by_header.text
        # bob, pasted from `keys new` (sha256: form), has no allow-list
        pasted = client(bob_key).chat.completions.with_raw_response.create(
            model="slowco/small-model", messages=HI)  # type: ignore[arg-type]
        assert pasted.headers["x-meshroute-route"] == "slowco/small-model#1"
        answers = [missing.text, by_header.text, str(auto.headers), str(mesh.headers),
                   httpx.get(f"{url}/v1/routing").text, httpx.get(f"{url}/metrics").text]
    assert len(fast.seen) + len(slow.seen) == 3 and recording.chats == 2
    assert {s.key for s in fast.seen + slow.seen} <= set(ENV.values())  # providers' own keys
    seen_by_providers = repr([(s.headers, s.body) for s in fast.seen + slow.seen])
    seen_by_node = repr(recording.headers)
    logged = log.read_text()
    for key in (ALICE_KEY, bob_key):
        for text in (seen_by_providers, seen_by_node, logged, *answers):
            assert key not in text
    assert all(name not in dict(h) for h in recording.headers
               for name in (b"authorization", b"x-api-key"))
    assert "client alice" in logged and "client bob" in logged  # logged by name only


def test_keys_new_refuses_a_bad_name() -> None:
    proc = subprocess.run([sys.executable, "-m", "meshroute_middleware.app.cli", "keys", "new",
                           "Not_A_Name"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "[a-z0-9-]+" in proc.stderr


@pytest.mark.parametrize(("clients", "env", "says"), [
    ('[[clients]]\nname = "Alice"\nkey = "env:ALICE_KEY"\n', {},
     "[[clients]] #1: name must be a string matching [a-z0-9-]+"),
    ('[[clients]]\nname = "alice"\nkey = "mr-pasted-literal-key"\n', {},
     "[[clients]] 'alice': key must be 'env:NAME', 'file:PATH' or 'sha256:"),
    ('[[clients]]\nname = "alice"\nkey = "env:NOT_SET_ANYWHERE"\n', {},
     "[[clients]] 'alice': env:NOT_SET_ANYWHERE: the environment variable"),
    ('[[clients]]\nname = "alice"\nkey = "env:ALICE_KEY"\n', {"ALICE_KEY": "k3y-tiny"},
     "[[clients]] 'alice': env:ALICE_KEY: the key is shorter than 16 characters"),
])
def test_a_bad_clients_table_is_one_line_and_exit_2(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path, clients: str,
        env: dict[str, str], says: str) -> None:
    fast, slow = providers
    config = tmp_path / "meshroute.toml"
    config.write_text(providers_toml(fast, slow) + clients)
    proc = subprocess.run(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--config",
         str(config), "--no-mdns", "--state-file", ":memory:", "--port", "0"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **ENV, **env})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert "pasted-literal" not in proc.stderr and "k3y-tiny" not in proc.stderr
