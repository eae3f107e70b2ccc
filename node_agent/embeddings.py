"""The OpenAI embeddings shapes the emulator reads and writes; pure functions.

Vectors are deterministic: each input's vector is drawn from SHA-256 of its canonical JSON,
so the same input gives the same vector on every node and every run (a test can tell which
input a vector belongs to), and is scaled to unit length as OpenAI's are.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from .chat import ChatRequestError, served_body
from .shard import EmulatorConfig

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
Input = str | list[int]


@dataclass(frozen=True, slots=True)
class EmbeddingJob:
    """What an embeddings request asks for, validated."""

    model: str
    inputs: tuple[Input, ...]
    dimensions: int
    base64: bool  # encoding_format "base64": little-endian float32, as OpenAI sends it

    @property
    def prompt_tokens(self) -> int:
        """Tokens of every input: a token array's length, a string's words."""
        return sum(len(i) if isinstance(i, list) else max(len(i.split()), 1)
                   for i in self.inputs)


def _inputs(raw: Any) -> tuple[Input, ...]:
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and raw and all(_is_tokens(t) for t in raw):
        return (list(raw),)  # one token array
    if (isinstance(raw, list) and 0 < len(raw) <= MAX_INPUTS
            and all(isinstance(i, str) or (isinstance(i, list) and i and all(map(_is_tokens, i)))
                    for i in raw)):
        return tuple(raw)
    raise ChatRequestError(f"'input' must be a string, a list of at most {MAX_INPUTS} strings, "
                           "a token array or a list of token arrays")


def _is_tokens(value: Any) -> bool:
    return type(value) is int and value >= 0


def parse_embeddings(body: Any, config: EmulatorConfig) -> EmbeddingJob:
    """Validate an embeddings body; raise ChatRequestError or ModelNotServedError."""
    body = served_body(body, config)
    model = body["model"]
    dimensions = body.get("dimensions", config.embedding_dim)
    if type(dimensions) is not int or not 1 <= dimensions <= config.embedding_dim:
        raise ChatRequestError(f"'dimensions' must be an integer in 1..{config.embedding_dim}")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise ChatRequestError("'encoding_format' must be 'float' or 'base64'")
    return EmbeddingJob(model, _inputs(body.get("input")), dimensions, encoding == "base64")


def vector(item: Input, dimensions: int) -> list[float]:
    """The unit vector of one input: SHA-256 blocks of its canonical JSON, 8 floats a block."""
    seed = json.dumps(item, separators=(",", ":")).encode()
    values: list[float] = []
    block = 0
    while len(values) < dimensions:
        digest = hashlib.sha256(seed + block.to_bytes(4, "big")).digest()
        values += [n / 2**31 - 1.0 for n in struct.unpack(">8I", digest)]
        block += 1
    del values[dimensions:]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _encoded(values: list[float], as_base64: bool) -> list[float] | str:
    if not as_base64:
        return values
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def embeddings_answer(job: EmbeddingJob) -> dict[str, Any]:
    """The `list` of `embedding` objects, one per input in order, with usage."""
    data = [{"object": "embedding", "index": i,
             "embedding": _encoded(vector(item, job.dimensions), job.base64)}
            for i, item in enumerate(job.inputs)]
    tokens = job.prompt_tokens
    return {"object": "list", "data": data, "model": job.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
