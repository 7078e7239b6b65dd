"""The process that starts a CLI agent and outlives nothing it started (standard library only). The package never
imports this module: :mod:`~trl_agentic.cli_agents.process` reads its source and runs ``python -I -S -c <source>
<config-json>``, inside the sandbox when there is one.

It makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``: every process the CLI starts stays its descendant, a
double fork or ``setsid`` included) and asks for ``SIGTERM`` when its parent dies (``PR_SET_PDEATHSIG``), sets the
resource limits, relays the sandbox's loopback port to the endpoint's Unix socket when it is given one (the sandbox
has a network namespace of its own, with loopback alone), runs the CLI with its standard input closed and waits for
it; then it stops every process left (``SIGSTOP`` until no new one appears, then ``SIGKILL``), and exits with the
CLI's status (``128 + n`` for a CLI killed by signal ``n``). ``SIGTERM`` (the parent's wall-clock bound) does the same
at once.
"""

import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
CHUNK = 65536


def _descendants(root):
    """Every process under ``root`` (read from ``/proc/<pid>/task/<tid>/children``)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    kids = [int(kid) for kid in fh.read().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                if kid not in found:
                    found.append(kid)
                    todo.append(kid)
    return found


def _end_all():
    """Stop every descendant until none is new (a process cannot fork once stopped), then kill them and reap."""
    stopped = set()
    while True:
        new = [pid for pid in _descendants(os.getpid()) if pid not in stopped]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
            stopped.add(pid)
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _pump(source, sink):
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(connection, path):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        connection.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, connection), daemon=True)
    back.start()
    _pump(connection, upstream)
    back.join()
    connection.close()
    upstream.close()


def _relay(port, path):
    """Accept on ``127.0.0.1:port`` (the sandbox's own loopback) and carry each connection to the Unix socket."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)

    def accept():
        while True:
            connection, _ = listener.accept()
            threading.Thread(target=_serve, args=(connection, path), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def _main():
    config = json.loads(sys.argv[1])
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # the trainer gone: end everything
    except (OSError, AttributeError):
        pass
    for name, value in config["limits"].items():
        limit = getattr(resource, name)
        hard = resource.getrlimit(limit)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))
    if config.get("relay"):
        _relay(config["relay"]["port"], config["relay"]["socket"])
    signal.signal(signal.SIGTERM, lambda *_: (_end_all(), os._exit(128 + signal.SIGTERM)))
    try:
        child = subprocess.Popen(config["argv"], cwd=config["cwd"], env=config["env"], stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"cannot start {config['argv'][0]}: {exc}", file=sys.stderr)
        os._exit(127)
    status = child.wait()
    _end_all()
    sys.stdout.flush()
    os._exit(status if status >= 0 else 128 - status)


_main()
