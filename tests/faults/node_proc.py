"""A scripted chat node in a process of its own (so a test can SIGKILL it):
`python -m tests.faults.node_proc NAME PORT TOKENS TOKEN_DELAY_S`."""

from __future__ import annotations

import sys

import uvicorn

from tests.upstream import FakeChat

if __name__ == "__main__":
    name, port, tokens, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(
        sys.argv[4])
    uvicorn.run(FakeChat(name, tokens=tokens, token_delay_s=delay).app(), host="127.0.0.1",
                port=port, log_level="warning")
