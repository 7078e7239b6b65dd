"""Functional behaviour of the local code interpreter (both backends available here)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
import warnings

import pytest
from helpers import sandbox_backends

from trl_agentic.tools import (
    ExecutionResult,
    PythonSandbox,
    SandboxError,
    ToolOutput,
    call_tool,
    extract_code,
)
from trl_agentic.tools.code import backends, isolation

BACKENDS = sandbox_backends()


def test_state_persists_across_blocks(sandbox):
    with sandbox.session() as session:
        assert session("x = 21\nprint('set')") == "set\n"
        assert session("def double(v):\n    return 2 * v") == ""
        assert session("double(x)") == "42\n"
        assert session("import math\nmath.sqrt(16)") == "4.0\n"
        assert session("y = x + 1\ny") == "22\n"
        assert session.last_result.ok
        assert session.num_calls == 5


def test_last_expression_none_is_not_printed(sandbox):
    with sandbox.session() as session:
        assert session("print('a')") == "a\n"
        assert session("None") == ""
        assert session("x = [1, 2]\nx") == "[1, 2]\n"


def test_one_shot_calls_do_not_share_state(sandbox):
    assert sandbox("secret_var = 1") == ""
    text = sandbox("print(secret_var)")
    assert "NameError" in text
    result = sandbox.run("print(6 * 7)")
    assert isinstance(result, ExecutionResult)
    assert result.ok and result.stdout == "42\n" and result.exit_status is None


def test_traceback_shows_user_code_only(sandbox):
    with sandbox.session() as session:
        session("def f(a):\n    return 1 / a")
        text = session("f(0)")
        assert "ZeroDivisionError: division by zero" in text
        assert "<cell-" in text and "return 1 / a" in text
        assert "repl.py" not in text and "<string>" not in text
        result = session.last_result
        assert not result.ok and result.error is not None and not result.timed_out
        # the session survives an exception
        assert session("f(2)") == "0.5\n"


def test_syntax_error_and_system_exit(sandbox):
    with sandbox.session() as session:
        assert "SyntaxError" in session("def broken(:")
        assert "SystemExit: 3" in session("import sys; sys.exit(3)")
        assert session("1 + 1") == "2\n"


def test_stdout_then_stderr_then_error(sandbox):
    text = sandbox("import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise ValueError('boom')")
    assert text.index("out") < text.index("err") < text.index("ValueError: boom")


def test_stdin_is_empty(sandbox):
    assert "EOFError" in sandbox("input()")


def test_timeout_restarts_session_and_says_state_is_lost():
    sb = PythonSandbox(timeout=1.0, pool_size=0)
    try:
        with sb.session() as session:
            session("keep = 5")
            start = time.monotonic()
            text = session("print('before'); import sys; sys.stdout.flush()\nwhile True: pass")
            assert time.monotonic() - start < 8
            assert "TimeoutError: execution exceeded 1 s" in text
            assert "state" in text and "lost" in text
            result = session.last_result
            assert result.timed_out and result.state_lost and not result.ok
            assert session.num_timeouts == 1
            out = session.invoke("print('after')")
            assert out.observation == "after\n" and out.ok
            assert "NameError" in session("keep")
            assert session.num_restarts == 1
    finally:
        sb.close()


def test_output_truncated_to_max_chars_keeping_head_and_tail():
    sb = PythonSandbox(pool_size=0, max_output_chars=200)
    try:
        out = sb.invoke("print('START')\nfor i in range(5000): print(i)\nprint('END')")
        assert out.observation_truncated and not out.error
        assert out.observation.startswith("START") and out.observation.rstrip().endswith("END")
        assert "truncated" in out.observation
        assert len(out.observation) < 300
        assert out.as_info()["observation_truncated"] == 1
    finally:
        sb.close()


def test_tool_output_flags(sandbox):
    ok = sandbox.invoke("print(1)")
    assert isinstance(ok, ToolOutput) and ok.ok and ok.as_info()["tool_error"] == 0
    bad = sandbox.invoke("raise RuntimeError('x')")
    assert bad.error and bad.as_info()["tool_error"] == 1 and bad.as_info()["tool_timeout"] == 0
    assert asyncio.run(call_tool(sandbox, ("print(2)",), timeout=30)).value.observation == "2\n"


def test_extract_code_from_fences():
    assert extract_code("```python\nprint(1)\n```") == "print(1)"
    assert extract_code("Let me compute:\n```py\nx = 1\n```\nand\n```\nprint(x)\n```") == "x = 1\nprint(x)"
    assert extract_code("print(2)\n") == "print(2)"
    assert extract_code("```python\nprint(3)") == "print(3)"


def test_fenced_code_runs(sandbox):
    assert sandbox("```python\nprint(2 + 3)\n```") == "5\n"


def test_close_kills_worker_and_refuses_further_calls(sandbox):
    session = sandbox.session()
    session("import os; pid = os.getpid()")
    worker = session._worker
    assert worker is not None and worker.alive()
    session.close()
    assert not worker.alive() and worker.proc.poll() is not None
    assert "closed" in session("print(1)")


def test_background_processes_die_with_the_session(sandbox):
    marker = f"trl-agentic-marker-{uuid.uuid4().hex}"
    session = sandbox.session()
    session(
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'])\n"
        "print('started')"
    )

    def running() -> bool:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as fh:
                        if marker.encode() in fh.read():
                            return True
                except OSError:
                    continue
        return False

    deadline = time.monotonic() + 10
    while not running() and time.monotonic() < deadline:  # the child may not have exec'd yet
        time.sleep(0.05)
    assert running()
    session.close()  # PID namespace (bwrap, unshare) or process group (plain fallback): the child goes too
    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running()


def test_process_exit_restarts_with_notice(sandbox):
    with sandbox.session() as session:
        session("v = 1")
        text = session("import os; os._exit(7)")
        assert "exited with status 7" in text and "lost" in text
        assert session.last_result.exit_status == 7 and session.last_result.state_lost
        assert "NameError" in session("v")


def test_worker_death_between_calls_is_reported(sandbox):
    with sandbox.session() as session:
        session("import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), os._exit(1))).start()")
        time.sleep(1.0)
        text = session("print('fresh')")
        assert "fresh" in text and "earlier variables are gone" in text
        assert session.last_result.state_lost


def test_acall_runs_sessions_concurrently(sandbox):
    async def main():
        sessions = [sandbox.session() for _ in range(3)]
        try:
            await asyncio.gather(*(s.acall(f"v = {i}") for i, s in enumerate(sessions)))
            outs = await asyncio.gather(*(s.acall("v * 10") for s in sessions))
            out = (await call_tool(sessions[0], ("v + 1",), timeout=30)).value
            return outs, out
        finally:
            for s in sessions:
                s.close()

    outs, out = asyncio.run(main())
    assert outs == ["0\n", "10\n", "20\n"]
    assert out.observation == "1\n"


def test_pool_keeps_warm_workers():
    sb = PythonSandbox(pool_size=2)
    try:
        deadline = time.monotonic() + 20
        while len(sb._pool.idle) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(sb._pool.idle) == 2
        worker = sb._pool.idle[0]
        session = sb.session()
        session("1")
        assert session._worker is worker
        session.close()
    finally:
        sb.close()
    assert not sb._pool.idle


def test_preimport_and_env():
    sb = PythonSandbox(pool_size=0, preimport=("math",), env={"MY_SETTING": "on"})
    try:
        assert sb("print(math.pi > 3, __import__('os').environ['MY_SETTING'])") == "True on\n"
    finally:
        sb.close()


def test_code_too_long_is_refused(sandbox):
    out = sandbox.invoke("x = 1\n" * 200_000)
    assert out.error and "longer than" in out.observation


def test_non_utf8_output_is_replaced(sandbox):
    text = sandbox(
        "import os, sys\nos.write(1, b'a\\xff\\xfeb\\n')\nsys.stdout.buffer.write(b'\\x80c\\n')\nprint('\\udcff')"
    )
    assert "a\ufffd\ufffdb" in text and "\ufffdc" in text and "\\udcff" in text


def test_fallback_warns_once_and_names_what_is_not_isolated(monkeypatch, capsys, caplog):
    monkeypatch.setattr(backends, "detect_sandbox_backend", lambda python=None: ("subprocess", "no bwrap"))
    monkeypatch.setattr(isolation, "_WARNED_FALLBACK", False)
    with pytest.warns(RuntimeWarning, match="subprocess fallback") as record:
        sb = PythonSandbox(pool_size=0)
    assert len(record) == 1 and "subprocess fallback" not in caplog.text + capsys.readouterr().err  # printed once
    message = str(record[0].message)
    assert "Not isolated" in message and "filesystem" in message
    assert sb.backend == "subprocess" and not sb.isolation.filesystem
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PythonSandbox(pool_size=0).close()
    sb.close()


def test_requesting_bwrap_when_it_does_not_work_raises(monkeypatch):
    monkeypatch.setattr(backends, "detect_sandbox_backend", lambda python=None: ("subprocess", "no bwrap"))
    with pytest.raises(SandboxError, match="bwrap"):
        PythonSandbox(backend="bwrap", pool_size=0)
    with pytest.raises(ValueError):
        PythonSandbox(backend="docker", pool_size=0)


def test_missing_interpreter_fails_clearly():
    # Either the constructor refuses it (it inspects the interpreter when it needs its paths) or the first call
    # returns an error observation; never an exception from a call.
    try:
        sb = PythonSandbox(backend="subprocess", pool_size=0, python="/nonexistent/python")
    except SandboxError as exc:
        assert "/nonexistent/python" in str(exc)
        return
    try:
        out = sb.invoke("print(1)")
        assert out.error and "could not start" in out.observation
    finally:
        sb.close()


def test_start_failure_at_run_time_is_an_observation(monkeypatch, sandbox):
    def boom():
        raise SandboxError("no more processes")

    session = sandbox.session()
    monkeypatch.setattr(sandbox, "_acquire_worker", boom)
    out = session.invoke("print(1)")
    assert out.error and "could not start" in out.observation
    session.close()


def test_isolation_report_is_consistent(sandbox):
    iso = sandbox.isolation
    assert iso.environment
    if iso.backend == "bwrap":
        assert iso.network and iso.filesystem and iso.pid_namespace and not iso.root
        assert iso.not_isolated() == []
    else:
        assert not iso.filesystem and any("filesystem" in m for m in iso.not_isolated())


def test_close_from_another_thread_during_a_run(sandbox):
    import threading

    session = sandbox.session()
    session("1")
    results = []
    thread = threading.Thread(target=lambda: results.append(session.invoke("import time\ntime.sleep(30)")))
    thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    session.close()
    thread.join(15)
    assert not thread.is_alive() and time.monotonic() - start < 5
    assert results and results[0].error and "closed while the code was running" in results[0].observation


@pytest.mark.skipif("bwrap" not in BACKENDS, reason="bubblewrap does not work on this machine")
def test_bwrap_with_an_interpreter_under_tmp(tmp_path):
    """A virtualenv under /tmp (a checkout there, as CI's) stays visible although the sandbox mounts its own /tmp."""
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    sandbox = PythonSandbox(python=str(venv / "bin" / "python"), backend="bwrap", pool_size=0)
    try:
        assert sandbox.run("import sys; print(sys.prefix)").stdout.strip() == str(venv)
    finally:
        sandbox.close()
