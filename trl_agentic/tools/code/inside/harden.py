"""Hardening of a sandbox worker before any user code runs (standard library only; runs inside the sandbox).

:func:`harden` drops capabilities and switches to an unprivileged uid when started as root, sets the resource
limits, asks to be killed when the parent dies, and installs a seccomp filter (:func:`install_seccomp`) that
refuses the system calls creating memory that ``RLIMIT_AS`` does not count: ``memfd_create``, ``memfd_secret``,
SysV ``shmget`` and ``msgget``. Such memory lives in the kernel (a file descriptor or an IPC id keeps it) and can
outgrow ``memory_mb`` many times once unmapped. The filter answers ``EPERM`` and allows everything else; it needs
no privilege (``no_new_privs`` is set first), so it works as root and unprivileged alike.
"""

import ctypes
import os
import resource
import signal
import struct

_IN_PID_NS = False

# seccomp, from <linux/filter.h>, <linux/seccomp.h> and <linux/audit.h>
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_RET_K = 0x06
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_EPERM = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_X32_SYSCALL_BIT = 0x40000000
# (audit arch, {system call: number}) per machine; other architectures get no filter (reported as such).
_SECCOMP_TABLE = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68}),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "memfd_secret": 447, "shmget": 194, "msgget": 186}),
}


def seccomp_program(machine):
    """The classic-BPF seccomp program for ``machine`` (``os.uname().machine``), as packed ``sock_filter``
    structs, or None when the machine is not in the table.

    It refuses (``EPERM``) every system call of another ABI (i386 or x32 calls on x86_64 use other numbers) and
    the calls in the table; it allows everything else.
    """
    if machine not in _SECCOMP_TABLE:
        return None
    arch, calls = _SECCOMP_TABLE[machine]
    deny = _SECCOMP_RET_ERRNO | _EPERM
    program = [
        (_BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_BPF_JEQ_K, 1, 0, arch),
        (_BPF_RET_K, 0, 0, deny),
        (_BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        program += [(_BPF_JGE_K, 0, 1, _X32_SYSCALL_BIT), (_BPF_RET_K, 0, 0, deny)]
    for number in calls.values():
        program += [(_BPF_JEQ_K, 0, 1, number), (_BPF_RET_K, 0, 0, deny)]
    program.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    return [struct.pack("HBBI", *instruction) for instruction in program]


def install_seccomp():
    """Install :func:`seccomp_program` on this process (inherited by every process it starts); True on success."""
    program = seccomp_program(os.uname().machine)
    if program is None:
        return False

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    code = b"".join(program)
    fprog = SockFprog(len(program), code)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


def _drop_capabilities():
    """Empty the capability bounding and inheritable sets (needs CAP_SETPCAP; a no-op without it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in range(64):
            if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # PR_CAPBSET_DROP; EINVAL: no more
                break

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [
                ("effective", ctypes.c_uint32),
                ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32),
            ]

        header = Header(0x20080522, 0)
        data = (Data * 2)()
        if libc.capget(ctypes.byref(header), data) == 0:
            data[0].inheritable = data[1].inheritable = 0
            libc.capset(ctypes.byref(header), data)
    except Exception:
        pass


def _set_pdeathsig():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1 and not _IN_PID_NS:
            os._exit(1)
    except Exception:
        pass


def _set_limit(name, soft, hard=None):
    which = getattr(resource, name, None)
    if which is None or soft is None:
        return
    hard = soft if hard is None else hard
    try:
        cur_soft, cur_hard = resource.getrlimit(which)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(which, (int(soft), int(hard)))
    except (ValueError, OSError):
        pass


def _switch_uid(uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        os._exit(3)
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:  # regaining root must be impossible
        os._exit(3)


def harden(cfg):
    """Apply ``cfg`` (see ``worker.py``) to this process; return whether the seccomp filter is installed.

    The CPU limit set here is the session's hard cap (a program cannot raise a hard limit); the per-block
    ``cpu_time`` is enforced by the parent, which counts the CPU time of the worker's whole process tree.
    """
    global _IN_PID_NS
    _IN_PID_NS = bool(cfg.get("pid_namespace"))
    uid = cfg.get("drop_to_uid")
    if os.geteuid() == 0 and uid is not None:
        _drop_capabilities()
    limits = cfg.get("limits", {})
    _set_limit("RLIMIT_CORE", 0)
    _set_limit("RLIMIT_AS", limits.get("as_bytes"))
    _set_limit("RLIMIT_FSIZE", limits.get("fsize_bytes"))
    _set_limit("RLIMIT_NOFILE", limits.get("nofile"))
    _set_limit("RLIMIT_NPROC", limits.get("nproc"))
    _set_limit("RLIMIT_CPU", limits.get("session_cpu_seconds"))
    if uid is not None and os.geteuid() == 0:
        _switch_uid(uid, cfg.get("drop_to_gid", uid))
    _set_pdeathsig()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past RLIMIT_FSIZE fail with EFBIG instead of killing
    return install_seccomp()
