"""Shared mDNS plumbing: interface choice, instance names, service infos.

The service types and the TXT codec are a contract between processes and live in the core
(`meshroute_middleware.core.contracts.txt`); they are re-exported here for node_agent's use.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

from zeroconf import InterfaceChoice, IPVersion, ServiceInfo
from zeroconf.asyncio import AsyncZeroconf

from meshroute_middleware.core.contracts.txt import NODE_SERVICE, TRACKER_SERVICE
from meshroute_middleware.core.contracts.txt import decode_node as decode_record
from meshroute_middleware.core.contracts.txt import encode_node as encode_record

__all__ = [
    "MAX_LABEL_BYTES", "MAX_NAME_BYTES", "NODE_SERVICE", "RESOLVE_TIMEOUT_MS",
    "TRACKER_SERVICE", "addresses_for",
    "decode_record", "encode_record", "host_name", "instance_name", "name_problem",
    "open_zeroconf", "parse_interfaces", "service_info",
]
MAX_LABEL_BYTES = 63  # RFC 1035 §2.3.4: a DNS label holds at most 63 octets
MAX_NAME_BYTES = 255  # RFC 1035 §2.3.4: a whole name
RESOLVE_TIMEOUT_MS = 1500


def parse_interfaces(spec: str) -> InterfaceChoice | list[str]:
    """'all' (every interface: real LANs) or comma-separated addresses such as '127.0.0.1'."""
    if spec.strip().lower() == "all":
        return InterfaceChoice.All
    addresses = [a.strip() for a in spec.split(",") if a.strip()]
    if not addresses:
        raise ValueError("--mdns-interfaces: give 'all' or comma-separated addresses")
    for address in addresses:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"--mdns-interfaces: {address!r} is not an IP address "
                             "(give 'all' or addresses such as 127.0.0.1)") from None
    return addresses


def open_zeroconf(spec: str) -> AsyncZeroconf:
    """An AsyncZeroconf on the chosen interfaces (IPv4 only when every address is IPv4)."""
    interfaces = parse_interfaces(spec)
    if isinstance(interfaces, list) and all(":" not in a for a in interfaces):
        return AsyncZeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only)
    return AsyncZeroconf(interfaces=interfaces)


def instance_name(ident: str, service: str) -> str:
    """The service instance name for an id, shortened with a hash to fit one DNS label."""
    label = ident.replace(".", "_")
    if len(label.encode()) > MAX_LABEL_BYTES:
        digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
        label = label.encode()[:MAX_LABEL_BYTES - 13].decode(errors="ignore") + "-" + digest
    return f"{label}.{service}"


def name_problem(name: str, service: str) -> str | None:
    """Why a received service instance name may not be used (a fixed word for the metric's
    reason label), or None. Checked before zeroconf sees the name: its ServiceInfo raises
    BadTypeInNameException on a control character, which must never reach a task."""
    if not isinstance(name, str) or not name.endswith("." + service):
        return "bad_name"
    label = name[:-len(service) - 1]
    if not label or len(label.encode("utf-8", "replace")) > MAX_LABEL_BYTES \
            or len(name.encode("utf-8", "replace")) > MAX_NAME_BYTES:
        return "bad_name"
    if not label.isprintable():  # control characters (C0, DEL, C1), separators
        return "bad_name"
    return None


def host_name(ident: str) -> str:
    """A stable mDNS host name for an id."""
    return f"meshroute-{hashlib.sha256(ident.encode()).hexdigest()[:12]}.local."


def addresses_for(url_host: str, spec: str) -> list[str]:
    """Addresses to publish: the URL's own IP, else the chosen interfaces, else a lookup."""
    try:
        address = ipaddress.ip_address(url_host)
        if not address.is_unspecified:
            return [str(address)]
        url_host = socket.gethostname()  # 0.0.0.0 listens everywhere: publish this host
    except ValueError:
        pass
    interfaces = parse_interfaces(spec)
    if isinstance(interfaces, list):
        return interfaces
    try:  # a host name on a real LAN: publish what it resolves to here
        infos = socket.getaddrinfo(url_host, None, socket.AF_INET)
        return sorted({str(info[4][0]) for info in infos})
    except OSError:
        return ["127.0.0.1"]


def service_info(service: str, ident: str, url: str, properties: Mapping[str, str],
                 spec: str) -> ServiceInfo:
    """A ServiceInfo for an id whose endpoint is `url`, carrying `properties` as TXT."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return ServiceInfo(service, instance_name(ident, service), port=port,
                       properties=dict(properties), server=host_name(ident),
                       parsed_addresses=addresses_for(parts.hostname or "127.0.0.1", spec))
