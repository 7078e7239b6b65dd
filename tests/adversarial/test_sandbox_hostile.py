"""Programs that try to get around the sandbox's limits: memory outside the address space (memfd, SysV shared
memory and message queues), CPU time beyond ``cpu_time``, a closed standard output, and secrets read from command
lines. Each runs on every backend available here; what a backend cannot guarantee is skipped with the reason.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from helpers import sandbox_backends

from trl_agentic.tools import PythonSandbox

BACKENDS = sandbox_backends()
MEMORY_MB = 128


@pytest.fixture(scope="module", params=BACKENDS)
def small(request):
    sb = PythonSandbox(backend=request.param, timeout=20, memory_mb=MEMORY_MB, pool_size=0, max_output_chars=4000)
    yield sb
    sb.close()


# Each program tries to hold 2 * MEMORY_MB in kernel objects that RLIMIT_AS does not count, then prints how many MB
# it held at once and releases them (so that a run on a vulnerable machine leaks nothing on the host).
HOLD_MEMFD = f"""
import os
held = 0
try:
    while held < {2 * MEMORY_MB}:
        fd = os.memfd_create('hold')
        for _ in range(16):
            os.write(fd, b'\\1' * (1 << 20))
        held += 16
except OSError as exc:
    print(type(exc).__name__, exc)
print('held', held)
"""

HOLD_SYSV_SHM = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
ids, held = [], 0
try:
    while held < {2 * MEMORY_MB}:
        sid = libc.shmget(0, 16 << 20, 0o600 | 0o1000)
        if sid < 0:
            raise OSError(ctypes.get_errno(), 'shmget')
        ids.append(sid)
        addr = libc.shmat(sid, None, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), 'shmat')
        ctypes.memset(addr, 1, 16 << 20)
        libc.shmdt(ctypes.c_void_p(addr))
        held += 16
except OSError as exc:
    print(type(exc).__name__, exc)
print('held', held)
for sid in ids:
    libc.shmctl(sid, 0, None)  # IPC_RMID
"""

HOLD_SYSV_MSG = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class Msg(ctypes.Structure):
    _fields_ = [('mtype', ctypes.c_long), ('mtext', ctypes.c_char * 8192)]
msg = Msg(1, b'x' * 8192)
queues, held = [], 0
try:
    while held < {2 * MEMORY_MB} << 20:
        qid = libc.msgget(0, 0o600 | 0o1000)
        if qid < 0:
            raise OSError(ctypes.get_errno(), 'msgget')
        queues.append(qid)
        while libc.msgsnd(qid, ctypes.byref(msg), 8192, 0o4000) == 0:  # IPC_NOWAIT: until the queue is full
            held += 8192
        if len(queues) > 100000:
            break
except OSError as exc:
    print(type(exc).__name__, exc)
print('held', held >> 20)
for qid in queues:
    libc.msgctl(qid, 0, None)  # IPC_RMID
"""


@pytest.mark.parametrize("program", [HOLD_MEMFD, HOLD_SYSV_SHM, HOLD_SYSV_MSG], ids=["memfd", "shm", "msg"])
def test_memory_outside_the_address_space_is_bounded(small, program):
    out = small.invoke(program)
    held = [line for line in out.observation.splitlines() if line.startswith("held ")]
    assert held, out.observation
    assert int(held[-1].split()[1]) < MEMORY_MB, out.observation
    assert small("print('still alive')") == "still alive\n"


def test_sysv_ipc_objects_stay_in_the_sandbox(small):
    if not small.isolation.ipc_namespace:
        pytest.skip("no IPC namespace for this backend here (documented)")
    key = int(uuid.uuid4().int % (1 << 30)) + 1
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"print(libc.semget({key}, 1, 0o600 | 0o1000) >= 0)\n"
    )
    with small.session() as session:
        session(code)
        with open("/proc/sysvipc/sem") as fh:
            keys = [int(line.split()[0]) for line in fh.read().splitlines()[1:] if line.split()]
        assert key not in keys


CPU_HOGS = {
    "raise_soft_limit": (
        "import resource, time\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))\n"
        "while True: pass\n"
    ),
    "ignore_sigxcpu": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass\n",
    "busy_children": (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(2)]\n"
        "time.sleep(60)\n"
    ),
}


@pytest.mark.parametrize("name", sorted(CPU_HOGS))
def test_cpu_time_limit_is_hard(name):
    backend = BACKENDS[0]
    sb = PythonSandbox(backend=backend, timeout=8, cpu_time=1, pool_size=0)
    try:
        start = time.monotonic()
        result = sb.run(CPU_HOGS[name])
        assert time.monotonic() - start < 7
        assert not result.timed_out and result.error and "CPUTimeLimitError" in result.error, result
        assert result.state_lost
        assert sb("print('after')") == "after\n"
    finally:
        sb.close()


CLOSERS = {
    "os_close_1": "import os\nos.close(1)",
    "sys_stdout_close": "import sys\nsys.stdout.close()",
    "close_1_and_2": "import os\nos.close(1)\nos.close(2)",
    "pipe_takes_fd_1": "import os\nos.close(1)\nr, w = os.pipe()",
    "dev_null_on_1": "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 1)",
    "close_all_but_the_protocol": (
        "import json, os, sys\ncfg = json.loads(sys.argv[1])\n"
        "for fd in set(range(1, 256)) - {cfg['in_fd'], cfg['out_fd']}:\n"
        "    try:\n        os.close(fd)\n    except OSError:\n        pass"
    ),
    "close_every_fd": (
        "import os\nfor fd in range(0, 256):\n    try:\n        os.close(fd)\n    except OSError:\n        pass"
    ),
}


@pytest.mark.parametrize("name", sorted(CLOSERS))
def test_closing_stdout_keeps_the_session_usable_or_says_so(small, name):
    """After a program closes its own stdout, the next block's output is shown, or the call is an error that
    says why; never an empty success, never a hang, and the sandbox keeps working."""
    with small.session() as session:
        start = time.monotonic()
        session.invoke(CLOSERS[name])
        out = session.invoke("import sys\nprint('out-after')\nprint('err-after', file=sys.stderr)")
        assert time.monotonic() - start < 15
        if out.ok:
            assert "out-after" in out.observation and "err-after" in out.observation, out
        else:
            assert "stdout" in out.observation or "standard output" in out.observation, out
            assert session("print('again')") == "again\n"
    assert small("print('pool ok')") == "pool ok\n"


def test_env_secrets_are_not_on_any_command_line(small):
    secret = f"sk-test-{uuid.uuid4().hex}"
    sb = PythonSandbox(backend=small.backend, pool_size=0, env={"API_TOKEN": secret})
    scan = (
        "import os\nfound = []\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        "        if os.environ['API_TOKEN'].encode() in open(f'/proc/{pid}/cmdline', 'rb').read():\n"
        "            found.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(found)"
    )
    try:
        with sb.session() as session:
            assert session(scan) == "[]\n"  # inside the sandbox
            on_host = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        if secret.encode() in fh.read():
                            on_host.append(pid)
                except OSError:
                    continue
            assert on_host == []  # `ps` on the host
            assert session("import os\nprint(os.environ['API_TOKEN'])") == secret + "\n"  # the program gets it
    finally:
        sb.close()


def _write_on_reply_pipe(payload: str) -> str:
    """A block that writes ``payload`` (Python bytes literal) on the worker's private reply pipe."""
    return ("import json, os, struct, sys\ncfg = json.loads(sys.argv[1])\n"
            f"os.write(cfg['out_fd'], {payload})\n")


FORGED_REPLY = "(lambda d: struct.pack('>I', len(d)) + d)(json.dumps({'error': None, 'dropped': {}}).encode())"
FORGERIES = {
    "a well-formed reply": _write_on_reply_pipe(FORGED_REPLY) + "1 / 0",
    "a reply with a guessed nonce": _write_on_reply_pipe(FORGED_REPLY.replace("'error': None", "'nonce': None, 'error': None")) + "1 / 0",
    "three replies": _write_on_reply_pipe(f"{FORGED_REPLY} * 3") + "1 / 0",
    "a garbled frame": _write_on_reply_pipe("b'\\x00\\x00\\x00\\x05abc'") + "1 / 0",
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forged_reply_never_shifts_results(small, name):
    """A program that writes on the protocol channel fails its own block; the next blocks get their own results
    (before the nonce, block 2 reported block 1's ZeroDivisionError)."""
    with small.session() as session:
        first = session.invoke(FORGERIES[name])
        assert not first.ok, first
        assert "ZeroDivisionError" in first.observation or "reply" in first.observation, first
        second = session.invoke("print('two')")
        assert second.ok and "two" in second.observation and "ZeroDivisionError" not in second.observation, second
        third = session.invoke("print('three')")
        assert third.ok and "three" in third.observation, third
