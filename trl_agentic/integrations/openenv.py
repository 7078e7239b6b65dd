"""OpenEnv environment servers on 127.0.0.1, run by the training run: started, health-checked, restarted and stopped.

An OpenEnv environment is served by its own FastAPI app (``openenv.core.env_server.create_app``) and driven through
its own client (an ``EnvClient`` subclass, one WebSocket session per client). TRL's documented way to train on one
is an ``environment_factory`` class whose ``__init__`` opens a client and whose methods call it; this module gives
that client a ``base_url``:

    servers = OpenEnvServers("guess_env.server.app:app", num_servers=2, environments=environments_per_round(args))

    class GuessGame(OpenEnvEnvironment):               # TRL's environment_factory
        def __init__(self):
            self.client = GuessEnv(base_url=servers.url()).sync()
        ...

:class:`~trl_agentic.integrations.openenv_environment.OpenEnvEnvironment`, the class's base, keeps what the client
returns, so that each turn carries the environment's reward and the key of its observation (GiGPO's state). An MCP
tool environment needs no class: ``environment=openenv_mcp_environment(servers, client=...)`` shows the model the
tools its server lists (:mod:`~trl_agentic.integrations.openenv_mcp`).

- **Started by the run.** Each server is ``python -m uvicorn <app> --host 127.0.0.1 --port <free port>`` with this
  process's interpreter (no Docker, no ``uv``), in a session of its own; its output goes to a log file whose tail is
  quoted when it fails to start. The first :meth:`OpenEnvServers.url` starts them (TRL's trainer builds one
  environment at construction, so before training), each waited for until ``/health`` answers.
- **A pool.** :meth:`~OpenEnvServers.url` hands the servers out in turn, so ``num_servers`` servers share the run's
  environments (one per process of a multi-process run: each process builds its own ``OpenEnvServers``).
- **Big enough for a round, checked at start.** Each environment instance holds one session of its server while it
  lives (TRL's instances are kept and reused), and a server refuses a session past its app's ``max_concurrent_envs``
  (``openenv init`` scaffolds 1): the trajectory whose instance was refused is lost, every round. Given
  ``environments``, the environments a round holds at once (:func:`environments_per_round` reads them from the
  trainer's config), the start opens ``ceil(environments / num_servers)`` sessions on each server through OpenEnv's
  HTTP session API (``POST /mcp``: ``openenv/session/create``, whose refusal names the server's own
  ``max_sessions``; then ``openenv/session/close``, which frees the slot before it answers) and refuses a pool of
  ``num_servers x max_sessions`` below ``environments`` in one line with both numbers and the fix.
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
``stop``, ``base_url``), so that it also works as an ``EnvClient(provider=...)``. OpenEnv itself is not imported
here: the app imports it, in the server's process, and the environment's client in the user's class.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
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

from .openenv_environment import OpenEnvEnvironment
from .openenv_mcp import OpenEnvMCPEnvironment, openenv_mcp_environment

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

    def sessions(self, wanted: int) -> int | None:
        """How many of ``wanted`` sessions the server holds at once: ``wanted`` when it opened them all, else its own
        limit (``max_sessions`` of its refusal: the app's ``max_concurrent_envs``); ``None`` when it does not serve
        OpenEnv's HTTP session API (an app not built by ``create_app``). The sessions opened are closed again.

        Raises:
            OpenEnvServerError: The server refused a session for another reason (the environment's constructor
                raised), in one line.
        """
        opened: list[str] = []
        try:
            for _ in range(wanted):
                answer = self._session_call("openenv/session/create", {})
                error = None if answer is None else answer.get("error")
                if error is None:
                    session_id = (answer or {}).get("result", {}).get("session_id")
                    if session_id is None:
                        return None
                    opened.append(session_id)
                    continue
                limit = (error.get("data") or {}).get("max_sessions")
                if limit is not None:
                    return int(limit)
                message = str(error.get("message") or error).strip().splitlines()[0]
                raise OpenEnvServerError(f"the environment server {self.app} did not open a session: {message}")
            return wanted
        finally:
            for session_id in opened:
                try:
                    self._session_call("openenv/session/close", {"session_id": session_id})
                except OpenEnvServerError as exc:  # the server went away: its sessions with it
                    logger.warning("%s", exc)

    def _session_call(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """One JSON-RPC call of OpenEnv's HTTP session API (``POST /mcp``): its answer, or ``None`` when the server
        does not serve the API (no such route, or no JSON-RPC answer). :class:`OpenEnvServerError` when the server
        does not answer within ``startup_timeout``."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        request = urllib.request.Request(f"{self.base_url}/mcp", data=body,
                                         headers={"Content-Type": "application/json"})
        why = "no JSON-RPC answer"
        try:
            with _OPENER.open(request, timeout=self.startup_timeout) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            answer, why = None, f"HTTP {exc.code}"
        except ValueError:
            answer, why = None, "no JSON"
        except OSError as exc:
            raise OpenEnvServerError(f"the environment server {self.app} did not answer {method} (POST /mcp): "
                                     f"{exc}") from None
        if isinstance(answer, dict) and isinstance(answer.get("result", answer.get("error")), dict):
            return answer
        logger.warning("the environment server %s answers POST /mcp with %s: how many sessions it holds is not "
                       "checked", self.app, why)
        return None

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
        environments: How many environments the run holds at once on this process
            (:func:`environments_per_round` of the trainer's config): the servers' sessions are checked against it
            at start (module docstring). ``None``: not checked.

    Raises:
        ValueError: The servers hold fewer sessions than ``environments`` (at start), in one line.
    """

    def __init__(self, app: str, num_servers: int = 1, env: dict[str, str] | None = None,
                 startup_timeout: float = 120.0, health_timeout: float = 2.0, environments: int | None = None) -> None:
        if not isinstance(num_servers, int) or num_servers < 1:
            raise ValueError(f"num_servers must be a positive int, got {num_servers!r}")
        if environments is not None and (not isinstance(environments, int) or environments < 1):
            raise ValueError(f"environments must be a positive int or None, got {environments!r}")
        self.environments = environments
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
            if self.environments is not None:
                self._check_capacity(self.environments)
        except BaseException:
            _stop_all(self.servers)
            raise
        self._started = True

    def _check_capacity(self, environments: int) -> None:
        """Refuse servers that hold fewer sessions at once than ``environments`` (module docstring). With the
        servers handed out in turn, ``environments`` fit ``n`` servers of ``m`` sessions each exactly when
        ``ceil(environments / n) <= m``, the sessions opened on each."""
        count = len(self.servers)
        each = -(-environments // count)
        held = [server.sessions(each) for server in self.servers]
        if None in held:
            return
        least = min(held)
        if least >= each:
            return
        app = self.servers[0].app
        raise ValueError(f"a round runs {environments} environments at once, but {_count(count, 'server')} x "
                         f"{_count(least, 'session')} each hold {count * least} (max_concurrent_envs={least} in {app}): "
                         f"pass num_servers={-(-environments // max(least, 1))}, or max_concurrent_envs={each} to its "
                         "create_app (with SUPPORTS_CONCURRENT_SESSIONS = True on the environment class)")

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


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def environments_per_round(args: Any) -> int:
    """How many environments a trainer with config ``args`` (``AgenticGRPOConfig`` / ``AgenticPPOConfig``) holds at
    once on one process: one per trajectory of a round run through TRL's ``environment_factory`` pool, whose
    instances are kept and reused.

    A training round rolls out ``per_device_train_batch_size * steps_per_generation`` rows (TRL's
    ``generation_batch_size`` over the processes; PPO's ``steps_per_generation`` is ``num_mini_batches *
    gradient_accumulation_steps``). Rounds run *now* besides: an evaluation's (``per_device_eval_batch_size`` rows,
    with ``eval_strategy`` set) and dynamic sampling's extra ones (a training round each). Synchronously
    (``max_staleness=0``) they run one after another: the largest. With rounds ahead (``max_staleness >= 1``) the
    background thread runs one training round at a time while a round of now may run beside it: their sum."""
    train = args.per_device_train_batch_size * args.steps_per_generation
    strategy = getattr(args, "eval_strategy", "no")
    evaluation = args.per_device_eval_batch_size if getattr(strategy, "value", strategy) != "no" else 0
    extra = train if getattr(args, "zero_variance_groups", None) == "dynamic_sampling" else 0
    now = max(evaluation, extra)
    return train + now if getattr(args, "max_staleness", 0) else max(train, now)


__all__ = ["OpenEnvEnvironment", "OpenEnvMCPEnvironment", "OpenEnvServer", "OpenEnvServerError", "OpenEnvServers",
           "environments_per_round", "openenv_mcp_environment"]
