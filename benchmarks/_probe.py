"""The stall probe: GET a cheap endpoint every INTERVAL seconds over one keep-alive connection
and log one line per answer: wall time, latency ms, own lateness ms, HTTP status (0: failed).

  python benchmarks/_probe.py HOST PORT PATH INTERVAL OUT

Blocking and alone in its process, so a stall it logs is the server's (or the machine's: the
lateness column says when the probe itself was not scheduled on time). Runs until terminated.
"""

from __future__ import annotations

import http.client
import sys
import time


def main(host: str, port: int, path: str, interval_s: float, out: str) -> None:
    conn: http.client.HTTPConnection | None = None
    with open(out, "w", buffering=1) as log:
        due = time.monotonic()
        while True:
            late_s = time.monotonic() - due
            began = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, port, timeout=30)
                conn.request("GET", path)
                answer = conn.getresponse()
                answer.read()
                status = answer.status
            except (OSError, http.client.HTTPException):
                conn, status = None, 0
            latency_s = time.perf_counter() - began
            log.write(f"{time.time():.4f} {latency_s * 1e3:.3f} {late_s * 1e3:.3f} {status}\n")
            due += interval_s
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                due = time.monotonic()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5])
