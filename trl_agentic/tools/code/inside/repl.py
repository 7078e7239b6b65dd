"""The REPL that runs inside a sandbox worker (standard library only; started by ``boot.py``, after ``harden.py``).

:func:`serve` reads length-prefixed JSON requests ``{"code": ...}`` from a private pipe, executes each block with
``exec`` in one persistent globals dict (so variables survive between blocks, like a notebook; the value of a final
bare expression is printed), and answers ``{"error": traceback-or-null, "dropped": {...}, "nonce": ...}`` on another
pipe. Every message of a block (the reply, a question to the parent) carries the request's ``nonce``: the program
runs in this process and can write on the reply pipe, but not know the nonce of a block the parent has not sent
yet, so what it writes can never pass for another block's reply (the parent ignores messages with a wrong nonce and
fails the block that wrote them).

Program output goes to file descriptors 1 and 2, which the parent reads. Python-level ``sys.stdout``/``sys.stderr``
keep the first and last ``output_limit`` bytes of each block and drop the middle (with a marker), so a print loop
cannot flood the parent. A program that closes or redirects its standard output gets it back at the next block
(:class:`_Stdio` keeps private copies of both descriptors); one that also closed those copies gets an error reply
that asks for a restart, and the worker exits.
"""

import ast
import builtins
import collections
import fcntl
import io
import json
import linecache
import os
import stat
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


class _Stdio:
    """The worker's standard output and error: private close-on-exec copies of descriptors 1 and 2 taken at start,
    restored before each block when the program closed or replaced them, and fresh Python-level streams when it
    closed those."""

    def __init__(self, head, tail):
        self.saved = {fd: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 16) for fd in (1, 2)}
        self.identity = {fd: self._identity(fd) for fd in (1, 2)}
        self.raws = {fd: _HeadTailRaw(fd, head, tail) for fd in (1, 2)}
        self.streams = {fd: _make_stream(raw) for fd, raw in self.raws.items()}

    @staticmethod
    def _identity(fd):
        try:
            info = os.fstat(fd)
        except OSError:
            return None
        return (info.st_dev, info.st_ino) if stat.S_ISFIFO(info.st_mode) else None

    def intact(self):
        """Whether the private copies still hold the parent's pipes (the program may have closed them too)."""
        return all(self._identity(saved) == self.identity[fd] for fd, saved in self.saved.items())

    def restore(self):
        """Put the parent's pipes back on descriptors 1 and 2 and install the streams; False when impossible."""
        if not self.intact():
            return False
        for fd, saved in self.saved.items():
            expected = self.identity[fd]
            if self._identity(fd) != expected:
                os.dup2(saved, fd)
            if self.streams[fd].closed or self.raws[fd].closed:
                self.raws[fd] = _HeadTailRaw(fd, self.raws[fd].head, self.raws[fd].tail)
                self.streams[fd] = _make_stream(self.raws[fd])
        sys.stdout, sys.stderr = self.streams[1], self.streams[2]
        return True

    def finish(self):
        """Flush the block's output; the bytes dropped per stream."""
        dropped = {}
        for name, fd in (("stdout", 1), ("stderr", 2)):
            try:
                self.streams[fd].flush()
            except BaseException:  # noqa: BLE001
                pass
            dropped[name] = self.raws[fd].finish()
        return dropped


_STDIO_LOST = (
    "SandboxError: the program closed the interpreter's standard output or error (and the copies kept to restore "
    "them); the interpreter was restarted and its state (variables, imports) was lost."
)


def serve(cfg, seccomp, load_calls):
    """Answer requests until the request pipe closes. ``seccomp``: whether the filter is installed (told to the
    parent); ``load_calls()``: the ``calls.py`` module, for ``{"call": question}`` requests (the program worker of
    a unit-test run) and ``{"code": test, "test": true}`` requests (its tests worker)."""
    in_fd, out_fd = cfg["in_fd"], cfg["out_fd"]
    if os.getpid() == 1:
        _become_init_parent((in_fd, out_fd))
    stdio = _Stdio(int(cfg.get("output_head_bytes", 65536)), int(cfg.get("output_tail_bytes", 65536)))
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    for module in cfg.get("preimport", ()):
        try:
            namespace[module.split(".")[0]] = __import__(module)
        except Exception:  # noqa: BLE001
            pass

    nonce = [None]  # the current request's: every message of this block carries it

    def rpc(question):
        _send(out_fd, {"rpc": question, "nonce": nonce[0]})
        reply = _recv(in_fd)
        return reply.get("rpc_reply") if isinstance(reply, dict) else None

    _send(out_fd, {"ready": True, "pid": os.getpid(), "uid": os.getuid(), "seccomp": bool(seccomp)})
    cell = 0
    calls = None
    while True:
        request = _recv(in_fd)
        if request is None:
            os._exit(0)
        if not stdio.restore():
            _send(out_fd, {"error": _STDIO_LOST, "dropped": {}, "restart": True, "nonce": request.get("nonce")})
            os._exit(0)
        cell += 1
        nonce[0] = request.pop("nonce", None)
        sys.stdin = open(os.devnull)  # noqa: SIM115
        reply = {"error": None, "nonce": nonce[0]}
        if ("call" in request or request.get("test")) and calls is None:
            calls = load_calls()
        if "call" in request:
            reply.update(calls.answer(request["call"], namespace))
        elif request.get("test"):
            reply["error"] = _run_test(request.get("code", ""), cell, calls, rpc)
        else:
            reply["error"] = _run_block(request.get("code", ""), cell, namespace)
        reply["dropped"] = stdio.finish()
        if not stdio.intact():  # reported on the block that did it; the next block runs in a fresh interpreter
            reply.update(error="\n".join(filter(None, [reply["error"], _STDIO_LOST])), restart=True)
            _send(out_fd, reply)
            os._exit(0)
        _send(out_fd, reply)


def _run_test(code, cell, calls, rpc):
    try:
        namespace = calls.test_namespace(code, rpc)
    except BaseException as exc:  # noqa: BLE001 - the program worker failed to answer: the test fails
        return _format_error(exc)
    return _run_block(code, cell, namespace)
