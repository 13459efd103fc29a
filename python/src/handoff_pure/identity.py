"""Who a reference node is (spec §5.2): node ids, the process id, the host identity by the
reference derivation, the runtime directory of node sockets (§7.1) and the keepalive plan of
a TCP timeout, in Python. The engine's are ``handoff.identity``'s; the tests hold the two
to each other."""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from pathlib import Path

from .transport import keepalive_plan

__all__ = ["random_id", "process_id", "host_id", "derive_host_id", "runtime_dir", "keepalive_plan"]


def random_id() -> str:
    """128 random bits as 32 lower-case hex characters (a node id)."""
    return secrets.token_hex(16)


_PROCESS_ID = random_id()
_PROCESS_PID = os.getpid()


def process_id() -> str:
    """The random id of this process instance, shared by all its nodes (new after a fork)."""
    global _PROCESS_ID, _PROCESS_PID
    if os.getpid() != _PROCESS_PID:
        _PROCESS_ID, _PROCESS_PID = random_id(), os.getpid()
    return _PROCESS_ID


def _read_trimmed(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):  # as the engine: unreadable or not UTF-8 reads as empty
        return ""


def host_id() -> str:
    """``$HANDOFF_HOST_ID`` if set and non-empty, else :func:`derive_host_id` of the machine id,
    the boot id (the hostname when both are missing) and this process's network namespace."""
    env = os.environ.get("HANDOFF_HOST_ID")
    if env:
        return env
    machine = _read_trimmed("/etc/machine-id") or _read_trimmed("/var/lib/dbus/machine-id")
    boot = _read_trimmed("/proc/sys/kernel/random/boot_id")
    hostname = _read_trimmed("/etc/hostname") if not machine and not boot else ""
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return derive_host_id(machine, boot, hostname, netns)


def derive_host_id(machine: str, boot: str, hostname: str, netns: str) -> str:
    """Hex of the first 8 bytes of SHA-256("handoff-host-id\\0" | machine | 00 | boot
    [| hostname] | 00 | netns); the hostname counts only when the machine and boot ids are
    both empty."""
    h = hashlib.sha256()
    h.update(b"handoff-host-id\x00")
    h.update(machine.encode())
    h.update(b"\x00")
    h.update(boot.encode())
    if not machine and not boot:
        h.update(hostname.encode())
    h.update(b"\x00")
    h.update(netns.encode())
    return h.digest()[:8].hex()


def runtime_dir() -> Path:
    """The folder of this user's node sockets: ``$HANDOFF_RUNTIME_DIR``, else
    ``$XDG_RUNTIME_DIR/handoff``, else ``/tmp/handoff-UID``; mode 0700, owned by us."""
    uid = os.geteuid()
    if os.environ.get("HANDOFF_RUNTIME_DIR"):
        d = Path(os.environ["HANDOFF_RUNTIME_DIR"])
    elif os.environ.get("XDG_RUNTIME_DIR"):
        d = Path(os.environ["XDG_RUNTIME_DIR"]) / "handoff"
    else:
        d = Path(f"/tmp/handoff-{uid}")
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.stat()
    if st.st_uid != uid:
        raise PermissionError(
            f"the runtime directory {d} belongs to uid {st.st_uid}, not to us (uid {uid}); set HANDOFF_RUNTIME_DIR"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(d, 0o700)
    return d
