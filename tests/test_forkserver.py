"""tests/forkserver.py gives what ``subprocess.run([sys.executable, ...])`` gives: exit status, output, argv,
working directory, environment, the end of a process (threads joined, atexit handlers), a timeout that kills."""

import os
import subprocess
import sys
import time

import forkserver
import pytest
from forkserver import run_python

PROGRAM = r"""
import atexit, os, sys, threading, time
atexit.register(lambda: print("atexit"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread"))).start()
print(sys.argv[1:], os.getcwd(), os.environ.get("FORKSERVER_PROBE"), __name__)
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 3])
def test_the_same_result_as_a_fresh_interpreter(code, tmp_path):
    env = {**os.environ, "FORKSERVER_PROBE": "x"}
    argv = ["-c", PROGRAM, str(code), "b"]
    assert forkserver._server(env) is not None  # forked, not the fallback
    forked = run_python(argv, env=env, cwd=tmp_path)
    fresh = subprocess.run([sys.executable, *argv], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == code and forked.stdout.splitlines()[-2:] == ["thread", "atexit"]


def test_a_script_runs_as_main_with_its_folder_on_the_path(tmp_path):
    (tmp_path / "sibling.py").write_text("VALUE = 7\n")
    (tmp_path / "script.py").write_text("import sys, sibling\nif __name__ == '__main__':\n"
                                        "    print(sibling.VALUE, sys.argv)\n")
    done = run_python([str(tmp_path / "script.py"), "a"], env=dict(os.environ), cwd=os.getcwd())
    assert done.returncode == 0 and done.stdout == f"7 [{str(tmp_path / 'script.py')!r}, 'a']\n"


def test_a_module_runs_as_python_m_runs_it(tmp_path):
    (tmp_path / "probe_module.py").write_text("import sys\nif __name__ == '__main__':\n    print(sys.argv)\n")
    env = dict(os.environ)  # -m finds it in the working directory
    forked = run_python(["-m", "probe_module", "x"], env=env, cwd=tmp_path)
    fresh = subprocess.run([sys.executable, "-m", "probe_module", "x"], env=env, cwd=tmp_path, capture_output=True,
                           text=True)
    assert forked.stdout == fresh.stdout == f"[{str(tmp_path / 'probe_module.py')!r}, 'x']\n"


def test_an_uncaught_exception_and_a_timeout():
    failed = run_python(["-c", "raise ValueError('boom')"], env=dict(os.environ), cwd=os.getcwd())
    assert failed.returncode == 1 and failed.stderr.rstrip().endswith("ValueError: boom")
    start = time.perf_counter()
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        run_python(["-c", "import time\ndef stuck():\n    time.sleep(60)\nprint('started', flush=True)\nstuck()"],
                   env=dict(os.environ), cwd=os.getcwd(), timeout=4)
    assert time.perf_counter() - start < 30
    if forkserver._server(dict(os.environ)) is not None:  # the forked child's stacks, before it was killed
        assert "in stuck" in timed_out.value.stderr


def test_requests_sent_together_are_each_served_at_once():
    """Requests that reach the server in one read (several threads asking at once) all start: none waits in a
    buffer for a next request that may never come (what hung the last of test_cli_help's commands)."""
    from concurrent.futures import ThreadPoolExecutor

    env = dict(os.environ)
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda i: run_python(["-c", f"print({i})"], env=env, cwd=os.getcwd(), timeout=20),
                             range(32)))
    assert [d.stdout for d in done] == [f"{i}\n" for i in range(32)]
    assert time.perf_counter() - start < 20
