"""OpenEnv environment servers on 127.0.0.1, run by the training run: started, health-checked, restarted and stopped.

An OpenEnv environment is served by its own FastAPI app (``openenv.core.env_server.create_app``) and driven through
its own client (an ``EnvClient`` subclass, one WebSocket session per client). TRL's documented way to train on one
is an ``environment_factory`` class whose ``__init__`` opens a client and whose methods call it; this module gives
that client a ``base_url``:

    servers = OpenEnvServers("guess_env.server.app:app", num_servers=2)

    class GuessGame:                                   # TRL's environment_factory
        def __init__(self):
            self.client = GuessEnv(base_url=servers.url()).sync()
        ...

- **Started by the run.** Each server is ``python -m uvicorn <app> --host 127.0.0.1 --port <free port>`` with this
  process's interpreter (no Docker, no ``uv``), in a session of its own; its output goes to a log file whose tail is
  quoted when it fails to start. The first :meth:`OpenEnvServers.url` starts them (TRL's trainer builds one
  environment at construction, so before training), each waited for until ``/health`` answers.
- **A pool.** :meth:`~OpenEnvServers.url` hands the servers out in turn, so ``num_servers`` servers share the run's
  environments (one per process of a multi-process run: each process builds its own ``OpenEnvServers``).
- **A server that dies or hangs costs its trajectories only.** Before handing a server out, :meth:`url` checks that
  its process is alive and that ``/health`` answers within ``health_timeout`` seconds; one that does not is stopped
  and started again on a thread of its own (counted in :attr:`OpenEnvServers.restarts`) while the next healthy
  server is handed out (a restart takes the app's start-up time, which may be longer than ``env_timeout``). The
  environments already connected to it fail their next call: a ``reset`` that raises or outlives ``env_timeout``
  ends its trajectory (``env_error`` / ``env_timeout``), a tool call that raises or outlives ``env_timeout / 2`` is
  answered with the error, and the trainer drops the instance whose call failed; the factory's next instance
  connects to a live server.
- **Stopped by the run.** :meth:`~OpenEnvServers.close` (also at the end of a ``with`` block, when the object is
  garbage-collected, and at exit) ends every server's process group.

:class:`OpenEnvServer` is one server, with OpenEnv's ``RuntimeProvider`` interface (``start``, ``wait_for_ready``,
``stop``, ``base_url``), so that it also works as an ``EnvClient(provider=...)``. Standard library only: OpenEnv
itself is imported by the app, in the server's process.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from typing import Any

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never goes through a proxy


class OpenEnvServerError(RuntimeError):
    """An environment server did not start: its exit code or the timeout, and the last line of its output (the
    output's tail is logged)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _app_path(app: str) -> str | None:
    """The folder to put on the server's ``PYTHONPATH`` so that it imports ``app``'s package as this process does
    (``None`` when this process cannot find it either: the server then says so in its log)."""
    top = app.partition(":")[0].split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    location = next(iter(spec.submodule_search_locations or []), None) or spec.origin
    return os.path.dirname(os.path.abspath(location)) if location else None


class OpenEnvServer:
    """One environment server: ``python -m uvicorn <app>`` on 127.0.0.1 (module docstring).

    Args:
        app: The ASGI app, as uvicorn names it (``"guess_env.server.app:app"``); its package must be importable here.
        env: Environment variables added to the server's (this process's otherwise).
        startup_timeout: Seconds to wait for ``/health`` after starting.
        health_timeout: Seconds ``/health`` may take to answer before the server counts as hung.
    """

    def __init__(self, app: str, env: dict[str, str] | None = None, startup_timeout: float = 120.0,
                 health_timeout: float = 2.0) -> None:
        if ":" not in app:
            raise ValueError(f"app must be uvicorn's 'package.module:attribute', e.g. 'guess_env.server.app:app', "
                             f"got {app!r}")
        self.app, self.env = app, dict(env or {})
        self.startup_timeout, self.health_timeout = startup_timeout, health_timeout
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self._log: Any = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (what an OpenEnv client takes as ``base_url``)."""
        if self.port is None:
            raise RuntimeError("the server has not been started: call start()")
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, port: int | None = None, env_vars: dict[str, str] | None = None, **_: Any) -> str:
        """Start the server's process (not waiting for it: :meth:`wait_for_ready`); returns its base URL."""
        self.stop()
        self.port = port or _free_port()
        environ = {**os.environ, **self.env, **(env_vars or {})}
        folder = _app_path(self.app)
        if folder is not None:
            environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, environ.get("PYTHONPATH")) if p)
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile()  # kept after stop(): a failed start quotes it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", self.app, "--host", LOOPBACK, "--port", str(self.port),
             "--log-level", "warning"],
            env=environ, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)
        return self.base_url

    def wait_for_ready(self, timeout_s: float | None = None) -> None:
        """Wait until ``/health`` answers; :class:`OpenEnvServerError` with the log's tail when the process ends or
        the timeout passes first."""
        deadline = time.monotonic() + (self.startup_timeout if timeout_s is None else timeout_s)
        while not self.healthy():
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise self._failed(f"exited with code {code} before it answered")
            if time.monotonic() > deadline:
                self.stop()
                raise self._failed(f"did not answer /health within {self.startup_timeout:g} s")
            time.sleep(0.1)

    def _failed(self, what: str) -> OpenEnvServerError:
        """The error of a start that failed, in one line (the output's last line); the output's tail is logged."""
        tail = self.log_tail()
        logger.warning("the environment server %s %s; its output ends:\n%s", self.app, what, tail)
        return OpenEnvServerError(f"the environment server {self.app} {what}: {tail.splitlines()[-1].strip()}")

    def alive(self) -> bool:
        """Whether the process runs (not whether it answers: :meth:`healthy`)."""
        return self.process is not None and self.process.poll() is None

    def healthy(self) -> bool:
        """Whether the process runs and ``/health`` answers 200 within ``health_timeout`` seconds."""
        if not self.alive():
            return False
        try:
            with _OPENER.open(f"{self.base_url}/health", timeout=self.health_timeout) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's output (one line per line of it, ``<no output>`` when empty)."""
        if self._log is None:
            return "<no output>"
        try:
            self._log.seek(0)
            text = self._log.read().decode("utf-8", errors="replace").strip()
        except (OSError, ValueError):
            return "<no output>"
        return text[-chars:] or "<no output>"

    def stop(self) -> None:
        """End the server's process group (SIGTERM, then SIGKILL after 5 s); its log is kept."""
        process = self.process
        if process is not None and process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(process.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.process = None  # only once it is gone: a stop interrupted on the way is tried again by the next one


class OpenEnvServers:
    """A pool of :class:`OpenEnvServer` for one run (module docstring); also a context manager.

    Args:
        app: The ASGI app, as uvicorn names it (``"guess_env.server.app:app"``).
        num_servers: How many servers the environments are spread over.
        env: Environment variables added to the servers'.
        startup_timeout: Seconds each server may take to answer ``/health`` after starting.
        health_timeout: Seconds ``/health`` may take before :meth:`url` restarts the server.
    """

    def __init__(self, app: str, num_servers: int = 1, env: dict[str, str] | None = None,
                 startup_timeout: float = 120.0, health_timeout: float = 2.0) -> None:
        if not isinstance(num_servers, int) or num_servers < 1:
            raise ValueError(f"num_servers must be a positive int, got {num_servers!r}")
        self.servers = [OpenEnvServer(app, env, startup_timeout, health_timeout) for _ in range(num_servers)]
        self.restarts = 0
        self._turn = itertools.cycle(range(num_servers))
        self._lock = threading.Lock()
        self._started = self._closed = False
        self._restarting: dict[int, threading.Thread] = {}
        self._finalizer = weakref.finalize(self, _stop_all, self.servers)

    def start(self) -> "OpenEnvServers":
        """Start every server and wait for each to answer (done by the first :meth:`url`)."""
        with self._lock:
            self._start()
        return self

    def _start(self) -> None:
        if self._started:
            return
        self._closed = False
        for server in self.servers:  # started together, waited for in turn: the imports overlap
            server.start()
        try:
            for server in self.servers:
                server.wait_for_ready()
        except BaseException:
            _stop_all(self.servers)
            raise
        self._started = True

    def url(self) -> str:
        """The base URL of the next healthy server in turn. A server whose process ended or whose ``/health`` does
        not answer is restarted on a thread of its own meanwhile (counted in :attr:`restarts`), and the next one is
        tried; only when none is healthy does the call wait for a restart to finish."""
        with self._lock:
            self._start()
            for _ in range(len(self.servers)):
                index = next(self._turn)
                if index in self._restarting:
                    continue
                server = self.servers[index]
                if server.healthy():
                    return server.base_url
                self._restart(index)
            index, waiting = next(iter(self._restarting.items()))
        waiting.join(timeout=self.servers[index].startup_timeout + 15.0)
        with self._lock:
            healthy = next((s for i, s in enumerate(self.servers) if i not in self._restarting and s.healthy()), None)
            if healthy is None:
                tail = self.servers[index].log_tail().splitlines()[-1].strip()
                raise OpenEnvServerError(f"no environment server of {self.servers[index].app} answers; the one "
                                         f"restarted last said: {tail}")
            return healthy.base_url

    def _restart(self, index: int) -> None:
        """Restart server ``index`` on a thread of its own (called with the lock held)."""
        server = self.servers[index]
        reason = "exited" if not server.alive() else f"did not answer /health within {server.health_timeout:g} s"
        logger.warning("the environment server at %s %s: restarting it (the environments connected to it fail their "
                       "next call)", server.base_url, reason)
        self.restarts += 1

        def restart() -> None:
            try:
                server.start()
                server.wait_for_ready()
            except Exception as exc:  # noqa: BLE001 - logged; url() tries it again when its turn comes
                logger.warning("the environment server %s did not restart: %s", server.app, exc)
            finally:
                with self._lock:
                    self._restarting.pop(index, None)
                    if self._closed:
                        server.stop()

        thread = threading.Thread(target=restart, name="trl-agentic-openenv-restart", daemon=True)
        self._restarting[index] = thread
        thread.start()

    def close(self) -> None:
        """Stop every server (a restart under way is waited for, then stopped)."""
        with self._lock:
            self._closed = True
            restarting = list(self._restarting.values())
        for thread in restarting:
            thread.join(timeout=self.servers[0].startup_timeout + 15.0)
        with self._lock:
            _stop_all(self.servers)
            self._started = False

    def __enter__(self) -> "OpenEnvServers":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _stop_all(servers: list[OpenEnvServer]) -> None:
    for server in servers:
        server.stop()


__all__ = ["OpenEnvServer", "OpenEnvServerError", "OpenEnvServers"]
