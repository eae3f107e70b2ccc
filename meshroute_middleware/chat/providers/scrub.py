"""Keys never leave in an answer: an upstream may echo the key it was given (some do, in a
401), so a provider's answer is scrubbed of every configured key before a client sees it."""

from __future__ import annotations

from meshroute_middleware.chat.keyring import Secret, scrub


def scrub_body(body: bytes, secrets: tuple[Secret, ...]) -> bytes:
    """`body` with every one of `secrets` replaced (unchanged, uncopied, when none occurs)."""
    if not any(s.reveal().encode() in body for s in secrets):
        return body
    return scrub(body.decode("utf-8", "replace"), secrets).encode()
