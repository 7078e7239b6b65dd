"""A local Python code interpreter for agents (ReTool-style ``<code>`` blocks), isolated from the trainer.

Every execution runs in a separate worker process, never in the training process. A *session* keeps one worker
alive, so variables, functions and imports defined in one block are visible in the next (a persistent globals
dict, like a notebook; the value of a final bare expression is printed). ``session.close()`` kills the worker. A
stateless call (``sandbox(code)`` / ``sandbox.run(code)``) is a one-shot session. A pool of pre-started workers
(``pool_size``) hides the start-up cost.

Two local backends, chosen once per process by ``backend="auto"``:

``"bwrap"`` (bubblewrap, used when the ``bwrap`` binary is installed *and* a probe sandbox actually starts):
    - new network namespace with no interface but a down loopback: no network at all, not even 127.0.0.1;
    - new mount namespace: the root is an empty tmpfs with read-only binds of ``/usr`` (and the ``/bin``, ``/lib``
      links), a few ``/etc`` files the dynamic linker and TLS need (not ``passwd``, ``shadow``, ``hosts``...), and
      the Python installation's own directories (prefix and ``sys.path``); home directories, the project checkout,
      ``/tmp`` of the host and everything else are absent. The work dir (``/workdir``, the cwd and ``$HOME``) and
      ``/tmp`` are private size-limited tmpfs (``tmpfs_size_mb``), gone with the session;
    - new PID, IPC, UTS (and cgroup) namespaces: the program sees only its own processes, cannot signal the
      trainer, and every process it starts dies when the session is closed or killed (``--die-with-parent``);
    - a cleared environment (the trainer's environment variables and secrets are not passed);
    - when the trainer runs as root, the worker drops every capability (bounding set included) and switches to a
      fresh unused uid/gid (or ``sandbox_uid``) before running any code, so ``RLIMIT_NPROC`` binds and workers
      cannot signal each other; otherwise bubblewrap runs unprivileged in a user namespace and the worker keeps
      the caller's uid (then ``max_processes`` counts on top of the caller's own processes).
``"subprocess"`` (fallback when bubblewrap is missing or cannot create namespaces, e.g. inside some containers):
    a plain child process with ``python -I`` (isolated mode), a cleared environment, a new session, a private temp
    work dir as cwd and the resource limits below. When ``unshare`` works (root, or user namespaces allowed) the
    worker also gets new network, IPC and PID namespaces. When the trainer runs as root and the Python installation is
    readable by other users, the worker drops to a fresh unprivileged uid; when it is not (e.g. a pyenv under
    ``/root``) the worker stays root. **Not isolated in this mode**: the filesystem (the program can read every
    file the worker's uid can read and write where that uid can write: with the caller's uid that includes your
    home directory and checkout; as root, everything), the network when ``unshare`` is unavailable, other
    processes of the same uid (it could signal the trainer when it runs under the same uid without a PID
    namespace), processes that call ``setsid`` can outlive the session without a PID namespace (they stay bound by
    ``RLIMIT_CPU``), and a worker left as root is not bound by ``RLIMIT_NPROC`` (a fork bomb then runs until the
    timeout). A warning naming what is not isolated is emitted once per process. See
    :attr:`PythonSandbox.isolation`.

Limits, in both backends (set before any user code runs): wall time per block (``timeout``, enforced by the
parent, which kills the whole worker), CPU seconds per block (``cpu_time``, counted by the parent over the
worker's whole process tree, which the program cannot change; a session-wide hard ``RLIMIT_CPU``,
``session_cpu_time``), address space per process (``memory_mb``, ``RLIMIT_AS``: a too large allocation raises
``MemoryError`` in the program; a seccomp filter refuses ``memfd_create`` and SysV shared memory and message
queues, whose memory ``RLIMIT_AS`` would not count), processes (``max_processes`` more tasks for the worker's uid, ``RLIMIT_NPROC``; not enforceable
for root, so only effective when the worker does not run as root), file size (``max_file_size_mb``), open files,
and output: Python-level ``print`` output beyond ``max_output_chars`` is dropped in the worker (first and last
parts kept), and the parent stops a program that writes more than ``max_read_bytes`` to its file descriptors.

What a call returns: the observation text (stdout, then stderr, then the last lines of the traceback on an
error), shortened to ``max_output_chars`` by keeping head and tail around a ``[... truncated ...]`` marker;
bytes that are not UTF-8 are decoded with replacement characters. A timeout returns
``TimeoutError: execution exceeded 5 s ...`` and restarts the session: its state is lost, and the text says so.
:meth:`PythonSession.run` returns the structured :class:`ExecutionResult`.

Example::

    sandbox = PythonSandbox(timeout=5, pool_size=2)
    with sandbox.session() as python:
        python("x = 21")
        python("x * 2")          # '42'
    sandbox("print(1 + 1)")      # '2' (one-shot)
    sandbox.close()

Modules: :mod:`.sandbox` (the tool and its options), :mod:`.session` (one trajectory's interpreter),
:mod:`.pool` (pre-started workers), :mod:`.worker` (one worker process), :mod:`.exchange` (one request and its
reply), :mod:`.protocol` (message framing), :mod:`.proctree` (CPU time of a process tree), :mod:`.launch` (how
workers start), :mod:`.bwrap` (the bubblewrap command), :mod:`.backends` (which backend works here),
:mod:`.isolation` (what it guarantees), :mod:`.host` (uids and paths of the host), :mod:`.inside` (what runs in
the sandbox: hardening, the REPL, calls between workers), :mod:`.unit_tests` (tests run apart from the program
they test), :mod:`.result` (what a block did), :mod:`.extract` (code in a tool call), :mod:`.base` (what the local
and E2B interpreters share), :mod:`.e2b`.
"""

from .backends import detect_sandbox_backend
from .base import CodeSandbox, CodeSession, SandboxError
from .e2b import E2BSandbox, E2BSession
from .extract import extract_code
from .isolation import SandboxIsolation
from .result import ExecutionResult
from .sandbox import PythonSandbox
from .session import PythonSession
from .unit_tests import run_unit_tests

__all__ = [
    "PythonSandbox",
    "PythonSession",
    "ExecutionResult",
    "SandboxIsolation",
    "SandboxError",
    "extract_code",
    "detect_sandbox_backend",
    "E2BSandbox",
    "E2BSession",
    "CodeSandbox",
    "CodeSession",
    "run_unit_tests",
]
