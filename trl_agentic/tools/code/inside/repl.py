"""The REPL loop that runs inside a sandbox process (standard library only).

This file is not imported by the package at run time: :mod:`trl_agentic.tools.code.worker` reads its source
and starts ``python -I -c <source> <config-json>`` (inside bubblewrap or a resource-limited subprocess). It

1. hardens itself (drops capabilities and switches to an unprivileged uid when started as root, sets resource
   limits, asks to be killed when its parent dies), then
2. reads length-prefixed JSON requests ``{"code": ...}`` from a private pipe, executes each block with ``exec`` in
   one persistent globals dict (so variables survive between blocks, like a notebook; the value of a final bare
   expression is printed), and
3. answers ``{"error": traceback-or-null, "dropped": {...}}`` on another pipe.

Program output goes to file descriptors 1 and 2, which the parent reads. Python-level ``sys.stdout``/``sys.stderr``
keep the first and last ``output_limit`` bytes of each block and drop the middle (with a marker), so a print loop
cannot flood the parent.
"""

import ast
import builtins
import collections
import io
import json
import linecache
import os
import resource
import signal
import struct
import sys
import traceback

_CELL_PREFIX = "<cell-"
_MAX_ERROR_CHARS = 16000


class _HeadTailRaw(io.RawIOBase):
    """Writes the first ``head`` bytes of a block to ``fd``, keeps the last ``tail`` bytes in memory and drops the
    middle; :meth:`finish` writes a marker and the tail at the end of the block."""

    def __init__(self, fd, head, tail):
        self.fd = fd
        self.head = head
        self.tail = tail
        self.reset()

    def reset(self):
        self.written = 0
        self.dropped = 0
        self.tail_chunks = collections.deque()
        self.tail_size = 0

    def writable(self):
        return True

    def _write_fd(self, data):
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except InterruptedError:
                continue
            except OSError:
                return
            view = view[n:]

    def write(self, b):
        data = bytes(b)
        n = len(data)
        if self.written < self.head:
            room = self.head - self.written
            self._write_fd(data[:room])
            self.written += min(room, n)
            data = data[room:]
        if data:
            self.tail_chunks.append(data)
            self.tail_size += len(data)
            while self.tail_size - len(self.tail_chunks[0]) >= self.tail:
                old = self.tail_chunks.popleft()
                self.tail_size -= len(old)
                self.dropped += len(old)
        return n

    def finish(self):
        """Write what was kept of the tail (after a marker when bytes were dropped); return the dropped count."""
        tail = b"".join(self.tail_chunks)
        if len(tail) > self.tail:
            self.dropped += len(tail) - self.tail
            tail = tail[len(tail) - self.tail :]
        if self.dropped:
            self._write_fd(f"\n... [{self.dropped} bytes truncated] ...\n".encode())
        if tail:
            self._write_fd(tail)
        dropped = self.dropped
        self.reset()
        return dropped


def _make_stream(raw):
    return io.TextIOWrapper(
        io.BufferedWriter(raw, buffer_size=8192), encoding="utf-8", errors="backslashreplace", write_through=False
    )


def _read_exact(fd, n):
    chunks = []
    while n > 0:
        try:
            chunk = os.read(fd, min(n, 1 << 20))
        except InterruptedError:
            continue
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(fd):
    header = _read_exact(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    data = _read_exact(fd, size)
    if data is None:
        return None
    return json.loads(data.decode("utf-8"))


def _send(fd, obj):
    data = json.dumps(obj).encode("utf-8", "backslashreplace")
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]


def _drop_capabilities():
    """Empty the capability bounding and inheritable sets (needs CAP_SETPCAP; a no-op without it)."""
    try:
        import ctypes

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
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1 and not _IN_PID_NS:
            os._exit(1)
    except Exception:
        pass


_IN_PID_NS = False


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


def _harden(cfg):
    global _IN_PID_NS
    _IN_PID_NS = bool(cfg.get("pid_namespace"))
    if os.geteuid() == 0 and cfg.get("drop_to_uid") is not None:
        _drop_capabilities()
    limits = cfg.get("limits", {})
    _set_limit("RLIMIT_CORE", 0)
    _set_limit("RLIMIT_AS", limits.get("as_bytes"))
    _set_limit("RLIMIT_FSIZE", limits.get("fsize_bytes"))
    _set_limit("RLIMIT_NOFILE", limits.get("nofile"))
    _set_limit("RLIMIT_NPROC", limits.get("nproc"))
    cpu = limits.get("cpu_seconds")
    if cpu is not None:
        _set_limit("RLIMIT_CPU", cpu, limits.get("session_cpu_seconds") or cpu)
    uid = cfg.get("drop_to_uid")
    if uid is not None and os.geteuid() == 0:
        gid = cfg.get("drop_to_gid", uid)
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
    _set_pdeathsig()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past RLIMIT_FSIZE fail with EFBIG instead of killing


def _format_error(exc):
    try:
        tb = exc.__traceback__
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(_CELL_PREFIX):
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:  # noqa: BLE001 - formatting must not fail
        try:
            text = f"{type(exc).__name__}: <exception could not be formatted>"
        except BaseException:  # noqa: BLE001
            text = "Exception: <exception could not be formatted>"
    if len(text) > _MAX_ERROR_CHARS:
        text = "...\n" + text[-_MAX_ERROR_CHARS:]
    return text


def _run_block(code, cell, namespace):
    filename = f"{_CELL_PREFIX}{cell}>"
    try:
        tree = ast.parse(code, filename=filename, mode="exec")
    except BaseException as exc:  # noqa: BLE001 - SyntaxError, MemoryError, RecursionError...
        return "".join(traceback.format_exception_only(type(exc), exc))[-_MAX_ERROR_CHARS:]
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    try:
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)
            if value is not None:
                namespace["_"] = value
                print(repr(value))
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are reported too
        return _format_error(exc)
    return None


def _become_init_parent(keep_fds):
    """When this process is PID 1 of a new PID namespace (``unshare --pid --fork``), signals without a handler
    (SIGXCPU from RLIMIT_CPU, a self-sent SIGSEGV...) would be ignored. Fork: the child runs the REPL; this process
    stays as a minimal init that reaps orphans and exits with the child's status (128 + N for signal N)."""
    child = os.fork()
    if child == 0:
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in keep_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == child:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main():
    cfg = json.loads(sys.argv[1])
    in_fd, out_fd = cfg["in_fd"], cfg["out_fd"]
    _harden(cfg)
    if os.getpid() == 1:
        _become_init_parent((in_fd, out_fd))
    head = int(cfg.get("output_head_bytes", 65536))
    tail = int(cfg.get("output_tail_bytes", 65536))
    raw_out, raw_err = _HeadTailRaw(1, head, tail), _HeadTailRaw(2, head, tail)
    out, err = _make_stream(raw_out), _make_stream(raw_err)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    limits = cfg.get("limits", {})
    block_cpu = limits.get("cpu_seconds")
    session_cpu = limits.get("session_cpu_seconds")
    for module in cfg.get("preimport", ()):
        try:
            namespace[module.split(".")[0]] = __import__(module)
        except Exception:  # noqa: BLE001
            pass
    _send(out_fd, {"ready": True, "pid": os.getpid(), "uid": os.getuid()})
    cell = 0
    while True:
        request = _recv(in_fd)
        if request is None:
            os._exit(0)
        cell += 1
        if block_cpu is not None:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            used = int(usage.ru_utime + usage.ru_stime) + 1
            _set_limit("RLIMIT_CPU", used + block_cpu, session_cpu or (used + block_cpu))
        sys.stdout, sys.stderr = out, err
        sys.stdin = open(os.devnull)  # noqa: SIM115
        error = _run_block(request.get("code", ""), cell, namespace)
        dropped = {}
        for name, stream, raw in (("stdout", out, raw_out), ("stderr", err, raw_err)):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
            dropped[name] = raw.finish()
        _send(out_fd, {"error": error, "dropped": dropped})


if __name__ == "__main__":
    main()
