"""Bounds shared by every process that parses another's data (HTTP, mDNS TXT, gossip).

One home, so that a value one process accepts is never refused by the next one on its way.
"""

from __future__ import annotations

from typing import Final

MAX_ID_CHARS: Final = 128  # node, model, tracker and origin ids
# A route signature, `model|node[0-21]->node[22-39]`: up to ~30 hops of 128-char node ids.
MAX_SIGNATURE_CHARS: Final = 4096
MAX_ERROR_CHARS: Final = 200  # a route's last error as statistics keep and gossip carries it
# Tokens/s, advertised or measured: anything above is a typo, a lie or a clock artefact.
MAX_TPS: Final = 1_000_000.0
# A request's `max_tokens` as meshroute reads it (measurement ceiling, the policy's answer
# classes): larger bounds say no more than this one (2**20), and a huge integer in a body
# could not even be made a float.
MAX_ANSWER_TOKENS: Final = 1 << 20
# A server's slot count (the requests it runs at once): vLLM's --max-num-seqs defaults to
# 256-1024 and llama.cpp's --parallel is a handful; 2**16 leaves room for any batch a server
# runs while a typo or a lie of millions is refused.
MAX_SLOTS: Final = 1 << 16
