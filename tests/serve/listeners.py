"""What a server's process tree listens on, read from /proc (no ``ss`` needed): the serve tests check that
nothing a server starts listens beyond its ``--host``."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def socket_inodes(pids: set[int]) -> set[str]:
    """The socket inodes the processes ``pids`` hold."""
    found = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    found.add(target[8:-1])
        except OSError:
            continue
    return found


def address(hexaddr: str) -> str:
    """The address of a /proc/net/tcp{,6} field (IPv4-mapped IPv6 addresses as IPv4)."""
    raw = bytes.fromhex(hexaddr.split(":")[0])
    if len(raw) == 4:
        return ".".join(str(b) for b in raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words).ipv4_mapped or ipaddress.IPv6Address(words))


def open_ports(pids: set[int]) -> list[tuple[str, str, int]]:
    """(protocol, address, port) of every TCP listener and bound UDP socket the processes hold."""
    inodes, found = socket_inodes(pids), []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{proto}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if inode in inodes and (state == "0A" or proto.startswith("udp")):  # 0A: LISTEN
                found.append((proto, address(local), int(local.rpartition(":")[2], 16)))
    return found


def tree_ports(pid: int) -> list[tuple[str, str, int]]:
    """``open_ports`` of ``pid`` and every process below it."""
    return open_ports(descendants(pid) | {pid})


__all__ = ["address", "descendants", "open_ports", "socket_inodes", "tree_ports"]
