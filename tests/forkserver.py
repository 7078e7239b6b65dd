"""Python subprocesses without the import cost: a fork server for tests that run ``python ...`` in a process of its
own (hostile code that may kill its interpreter, benchmark scripts run as a user types them).

Each such process used to pay for importing torch, transformers and TRL again, about 10 CPU-seconds on a CI
machine's core and most of what those tests cost. :func:`run_python` instead asks a server process, started once per
environment with those modules imported, to ``fork`` a child that runs the command: a process of its own (its own
pid, exit status and files 0/1/2; at its end non-daemon threads are joined, ``atexit`` handlers run and the files
flushed, as at the end of ``python ...``, less the teardown of every module), but born with the modules loaded. Where forking is not possible (no ``os.fork``, or the
server holds a thread after its imports, which a child would lose), it runs ``subprocess.run`` as before, so the
result never depends on the server: only the time does. A child that outlives its timeout prints its Python stacks
(``faulthandler``) to the standard error that its ``TimeoutExpired`` carries, and is killed.

The child starts as ``python -c CODE ...``, ``python -m MODULE ...`` or ``python SCRIPT ...`` would: ``sys.argv``,
``sys.path[0]`` (the script's folder, the working directory for ``-m``, ``''`` for ``-c``), ``__name__ == "__main__"``, the working directory, standard input from
``/dev/null``; environment variables are the server's, fixed when it started (a request with another environment gets
its own server), because some of them are read only at import time (``HF_HUB_OFFLINE``, ``OMP_NUM_THREADS``); the
child's ``os.environ`` is the request's.

Not for tests of what a user sees when a command starts (``tests/test_quiet.py``, the one-line errors of the
recipes): what the preloaded imports print (warnings) is printed once by the server, not by each child.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PRELOAD = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "trl_agentic")
"""What the server imports before it forks (each child finds them in ``sys.modules``)."""
VOLATILE = ("PYTEST_CURRENT_TEST",)
"""Variables that change from test to test and no import reads: one server serves every value (the child gets the
request's)."""

SERVER = r'''
import atexit, faulthandler, importlib, json, os, runpy, selectors, sys, threading, traceback
for name in sys.argv[1].split(","):
    importlib.import_module(name)
if threading.active_count() != 1:  # a child would hold a copy of a thread that does not run
    print(json.dumps({"unsafe": [t.name for t in threading.enumerate()]}), flush=True)
    sys.exit(0)
print(json.dumps({"ready": True}), flush=True)


def child(request):
    os.setpgrp()  # the request's process group: a timeout kills it and whatever it started
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    if request["timeout"] is not None:  # a hung child's Python stacks reach its stderr before the parent kills it
        faulthandler.dump_traceback_later(max(request["timeout"] - 3, 1), exit=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":  # run_module sets sys.argv[0] to the module's file, as -m does
            sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    # what the interpreter's shutdown does that a program can see, without tearing down every module (seconds
    # with torch loaded): non-daemon threads joined, atexit handlers run, the files flushed
    faulthandler.cancel_dump_traceback_later()
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code or 0)


selector = selectors.DefaultSelector()
selector.register(0, selectors.EVENT_READ)
running = {}
unread = b""  # read from file 0 itself: a buffered readline would keep a second request where select cannot see it
while True:
    for _ in selector.select(timeout=0.05):
        chunk = os.read(0, 1 << 16)
        if not chunk:
            sys.exit(0)
        *lines, unread = (unread + chunk).split(b"\n")
        for line in lines:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                selector.close()
                child(request)
            running[pid] = request["id"]
            print(json.dumps({"id": request["id"], "pid": pid}), flush=True)
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        print(json.dumps({"id": running.pop(pid), "returncode": os.waitstatus_to_exitcode(status)}), flush=True)
'''


class _Server:
    """One server process for one environment and working directory (module docstring)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lock = threading.Lock()
        self.next_id = 0
        self.pids: dict[int, int] = {}
        self.done: dict[int, int] = {}
        self.changed = threading.Condition()
        self.process = subprocess.Popen([sys.executable, "-c", SERVER, ",".join(PRELOAD)], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, bufsize=1)
        first = self.process.stdout.readline()
        self.ready = bool(first) and json.loads(first).get("ready", False)
        if self.ready:
            threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()
        else:
            self.process.wait()

    def _read(self) -> None:
        for line in self.process.stdout:
            message = json.loads(line)
            with self.changed:
                if "pid" in message:
                    self.pids[message["id"]] = message["pid"]
                else:
                    self.done[message["id"]] = message["returncode"]
                self.changed.notify_all()

    def run(self, argv: list[str], env: dict[str, str], cwd: str,
            timeout: float | None) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="forkserver_") as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            with self.lock:
                self.next_id += 1
                request_id = self.next_id
                self.process.stdin.write(json.dumps({"id": request_id, "argv": argv, "cwd": cwd, "env": env,
                                                     "out": out, "err": err, "timeout": timeout}) + "\n")
                self.process.stdin.flush()
            with self.changed:
                finished = self.changed.wait_for(lambda: request_id in self.done, timeout=timeout)
                pid = self.pids.get(request_id)
            if not finished:
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                with self.changed:
                    self.changed.wait_for(lambda: request_id in self.done, timeout=30)
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, _read(out), _read(err))
            with self.changed:
                returncode = self.done.pop(request_id)
                self.pids.pop(request_id, None)
            return subprocess.CompletedProcess([sys.executable, *argv], returncode, _read(out), _read(err))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _read(path: str) -> str:
    return Path(path).read_text(errors="replace") if os.path.exists(path) else ""


_servers: dict[tuple, _Server] = {}
_servers_lock = threading.Lock()


def _server(env: dict[str, str]) -> _Server | None:
    if not hasattr(os, "fork") or os.environ.get("TRL_AGENTIC_TESTS_NO_FORKSERVER"):
        return None
    key = tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE))
    with _servers_lock:
        if key not in _servers:
            _servers[key] = _Server({k: v for k, v in env.items() if k not in VOLATILE})
        server = _servers[key]
    return server if server.ready else None


@atexit.register
def _close_servers() -> None:
    for server in _servers.values():
        server.close()


def run_python(argv: list[str], *, env: dict[str, str], cwd: str | os.PathLike,
               timeout: float | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True,
    timeout=timeout)``, forked from a server that has :data:`PRELOAD` imported (module docstring); the same result,
    less the imports' time. ``argv`` starts with a script's path, ``-c`` or ``-m``."""
    server = _server(env)
    if server is None:
        return subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
    return server.run(list(argv), dict(env), str(cwd), timeout)
