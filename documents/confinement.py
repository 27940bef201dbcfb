"""What the document-parsing child may reach: confinement by the kernel, not by convention.

The child (``documents.sandbox``) parses hostile bytes. A parser bug that lets a file run code
must not give that code the appliance: its secret key and credentials under ``var/``, the
database, the broker, the engine, the network, or a fork bomb. So the child, before it reads any
file, confines itself, each layer independent of the others and each skipped (and reported) where
the kernel refuses it:

1. **No network.** A new network namespace (in a new user namespace, which an unprivileged user
   may make; root may make the network namespace alone): no interface but a loopback that is
   down, so not even the appliance's own loopback services are reachable over TCP or UDP.
2. **Resource limits**: open files (``RLIMIT_NOFILE``), the size of any file it writes
   (``RLIMIT_FSIZE``), no core dumps, and, where it counts only the child's own processes (in
   its own user namespace), processes (``RLIMIT_NPROC``; the kernel exempts root from it, which
   is one reason ``deploy/appliance.service`` runs the appliance as its own user).
3. **Landlock** (Linux 5.13+): the file system is read-only and only where Python, its packages
   and the OCR programs live (the appliance's ``documents`` package, the virtualenv, ``/usr``,
   a few files of ``/etc``); writes only in its own temporary directory. ``var/`` (secret key,
   credentials, database files, uploads), ``/etc/appliance`` and every home directory are out of
   reach. From Landlock ABI 4 TCP bind and connect are refused too, and from ABI 6 abstract Unix
   sockets and signals to processes outside the child.

``confine`` returns what held, which the child reports to its parent at start-up.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

OPEN_FILES = 256
FILE_SIZE_BYTES = 512 * 1024 * 1024  # a rendered page is a few MB; nothing legitimate writes more
PROCESSES = 32  # the child, pdftoppm and tesseract (and their threads) with room to spare

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_SYS_LANDLOCK_CREATE_RULESET = 444  # the same number on every architecture (new syscall table)
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

# Landlock's file system rights, and the ABI that introduced each.
_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_ABI1 = (1 << 13) - 1  # execute ... make_sym
_FS_MAKE_SPECIAL = (1 << 6) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)  # char, sock, fifo, block, sym
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1

_READ_ONLY_FILE = _FS_EXECUTE | _FS_READ_FILE
_READ_ONLY_DIR = _READ_ONLY_FILE | _FS_READ_DIR

# What the child and the programs it starts read, beyond Python's own prefixes.
SYSTEM_READ_PATHS = (
    "/usr",
    "/lib",
    "/lib64",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/fonts",
    "/var/cache/fontconfig",  # fonts pdftoppm renders with, scanned once, not per page
    "/etc/ssl/openssl.cnf",
    "/proc/self",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/sys/devices/system/cpu",
    "/dev/urandom",
)
DEVICES_READ_WRITE = ("/dev/null",)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]  # fmt: skip


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass
class Confinement:
    """What held, for the parent's log and for tests."""

    network_namespace: bool = False
    user_namespace: bool = False
    landlock_abi: int = 0  # 0: no Landlock (an older kernel, or disabled)
    landlock_network: bool = False
    processes_limited: bool = False
    limits: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _namespaces(libc, result: Confinement) -> None:
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
        result.user_namespace = result.network_namespace = True
        try:  # the same ids inside as outside, so that files keep their owners
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as exc:
            result.problems.append(f"user namespace id maps: {exc}")
        return
    first = _errno_text()
    if libc.unshare(_CLONE_NEWNET) == 0:
        result.network_namespace = True
        return
    result.problems.append(f"no network namespace: {first}; {_errno_text()}")


def _limits(result: Confinement) -> None:
    wanted = {
        "RLIMIT_NOFILE": OPEN_FILES,
        "RLIMIT_FSIZE": FILE_SIZE_BYTES,
        "RLIMIT_CORE": 0,
    }
    # RLIMIT_NPROC counts every process of the user, the appliance's own included, unless the
    # child has a user namespace of its own (where it counts only the child's).
    if result.user_namespace:
        wanted["RLIMIT_NPROC"] = PROCESSES
    for name, value in wanted.items():
        which = getattr(resource, name)
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        try:
            resource.setrlimit(which, (value, value))
            result.limits[name] = value
        except (ValueError, OSError) as exc:
            result.problems.append(f"{name}: {exc}")
    if "RLIMIT_NPROC" in result.limits and os.getuid() == 0:
        # The kernel exempts root from RLIMIT_NPROC, in any user namespace.
        result.problems.append("running as root: the process limit does not apply (run as the appliance's own user)")
    result.processes_limited = "RLIMIT_NPROC" in result.limits and os.getuid() != 0


def _landlock(libc, result: Confinement, *, read_paths: list[str], write_paths: list[str]) -> None:
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        result.problems.append(f"no Landlock: {_errno_text()}")
        return
    handled_fs = _FS_ABI1
    if abi >= 2:
        handled_fs |= _FS_REFER
    if abi >= 3:
        handled_fs |= _FS_TRUNCATE
    if abi >= 5:
        handled_fs |= _FS_IOCTL_DEV
    attr = _RulesetAttr(
        handled_access_fs=handled_fs,
        handled_access_net=(_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0,  # no rule: none allowed
        scoped=(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0,
    )
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16  # older kernels know two fields
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        result.problems.append(f"Landlock ruleset: {_errno_text()}")
        return
    try:
        grants = [(p, _READ_ONLY_DIR) for p in read_paths]
        # Files and directories may be made, written and removed there; nothing run from there,
        # and no sockets, pipes, devices or links made.
        writable = _FS_ABI1 & ~(_FS_EXECUTE | _FS_MAKE_SPECIAL)
        grants += [(p, writable | (handled_fs & (_FS_REFER | _FS_TRUNCATE))) for p in write_paths]
        grants += [(p, _READ_ONLY_FILE | _FS_WRITE_FILE | (handled_fs & (_FS_TRUNCATE | _FS_IOCTL_DEV)))
                   for p in DEVICES_READ_WRITE]  # fmt: skip
        for path, access in grants:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not on this system (/lib64 on some): nothing to allow
            try:
                if not os.path.isdir(f"/proc/self/fd/{fd}"):
                    # A file may be given only a file's rights.
                    access &= _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
                rule = _PathBeneathAttr(allowed_access=access & handled_fs, parent_fd=fd)
                if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                    result.problems.append(f"Landlock rule for {path}: {_errno_text()}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            result.problems.append(f"no_new_privs: {_errno_text()}")
            return
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0):
            result.problems.append(f"Landlock restrict_self: {_errno_text()}")
            return
        result.landlock_abi = abi
        result.landlock_network = abi >= 4
    finally:
        os.close(ruleset)


def python_read_paths(import_root: str) -> list[str]:
    """Where this interpreter and its packages live, and the appliance's own ``documents``
    package: only that one, and nothing at or above the project directory, which also holds
    ``var/``."""
    root = Path(import_root).resolve()
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *filter(None, sys.path)}
    executable = Path(sys.executable)
    paths.update({str(executable.parent), str(executable.resolve().parent)})
    allowed = {str(root / "documents")}
    for path in paths:
        resolved = Path(path).resolve()
        if resolved.exists() and resolved != Path("/") and not root.is_relative_to(resolved):
            allowed.add(str(resolved))
    return sorted(allowed)


def confine(*, import_root: str, temp_dir: str, extra_read_paths: tuple[str, ...] = (),
            protected: tuple[str, ...] = ()) -> Confinement:  # fmt: skip
    """Confine this process (the child, before it reads any file). Never raises: a layer the
    kernel refuses is left out and named in ``problems``. ``protected``: directories no grant
    may cover (the appliance's ``var/``, wherever it is); a grant that would is left out."""
    result = Confinement()
    if not sys.platform.startswith("linux"):
        result.problems.append("not Linux: no confinement")
        return result
    libc = _libc()
    _namespaces(libc, result)
    _limits(result)
    read_paths = []
    for path in [*SYSTEM_READ_PATHS, *python_read_paths(import_root), *extra_read_paths]:
        resolved = Path(path).resolve()
        covered = [p for p in protected if Path(p).resolve().is_relative_to(resolved)]
        if covered:
            result.problems.append(f"{path} is not readable: it holds {covered[0]}, which must stay out of reach")
            continue
        read_paths.append(path)
    _landlock(libc, result, read_paths=read_paths, write_paths=[temp_dir])
    return result
