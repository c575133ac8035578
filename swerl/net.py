"""This machine's place on the network: the address it reaches a peer from, whether an address is its own,
and the interface an address sits on.

A process on several nodes must never assume loopback, nor the address its hostname resolves to (Debian
maps the hostname to 127.0.1.1; a container to an address on a bridge the peers may not route to). The
address that counts is the one the kernel picks to reach the peer: a UDP socket `connect`ed to the peer
(no packet is sent) reports it. Standard library only, so every room may use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's IPv4 address


def resolve(host: str) -> str:
    """`host` as an IP address (a name resolved; an IP returned as it is). Raises OSError when it does not
    resolve."""
    host = host.strip("[]")
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]


def is_loopback(host: str) -> bool:
    """`host` is a loopback name or address (localhost, 127.0.0.0/8, ::1)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(resolve(host)).is_loopback
    except (OSError, ValueError):
        return False


def is_this_machine(host: str) -> bool:
    """`host` names this machine: loopback, or an address one of its interfaces holds (a socket can bind to
    exactly those)."""
    if is_loopback(host):
        return True
    try:
        ip = resolve(host)
    except OSError:
        return False
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


def address_towards(host: str) -> str:
    """The address of this machine that `host` reaches it at: the source address the kernel routes to
    `host` from (loopback for a host on this machine's loopback). Raises OSError when there is no route."""
    ip = resolve(host)
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))  # UDP: no packet leaves, the kernel only picks the route
        return str(s.getsockname()[0])


def interface_of(address: str) -> str | None:
    """The name of the interface holding IPv4 `address` (None: no interface here holds it, or IPv6)."""
    try:
        packed = socket.inet_aton(address)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                got = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if got[20:24] == packed:
                return name
    return None


__all__ = ["address_towards", "interface_of", "is_loopback", "is_this_machine", "resolve"]
