"""The wire formats of the other APIs served over the chat path, one module each: pure
encoding, strict parsing and translation to and from chat completions, no I/O (as zeroconf
keeps its wire parsing in `_protocol/`; an import-linter contract keeps it so).

- `anthropic`: Anthropic Messages requests, messages and errors <-> chat completions;
- `anthropic_stream`: a chat-completions SSE stream as Messages' events;
- `anthropic_chat`: the other way, for a route that speaks Messages (`api = "anthropic"`);
- `responses_request` / `responses_answer`: OpenAI Responses (the stateless subset).
"""
