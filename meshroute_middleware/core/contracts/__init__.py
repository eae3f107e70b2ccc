"""Contracts between processes, one module each: what one process writes and another parses.

- `plan`: the x-meshroute-plan header (gateway -> route head -> next hops);
- `txt`: the node and tracker mDNS TXT records and the service type names;
- `error_body`: the OpenAI-style JSON error every client-visible error carries;
- `cache`: the x-meshroute-cache response header (a prompt's prefix warm or cold);
- `limits`: the bounds every parser of another process's data enforces alike.

Pure like the rest of the core: encoding and strict parsing, no I/O.
"""
