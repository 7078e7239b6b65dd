"""The sandbox as an unprivileged trainer would run it (bwrap in a user namespace; the subprocess fallback with
RLIMIT_NPROC binding). CI runners usually are not root, so there these paths run in the other tests anyway; on a
root machine this test replays them as uid 65534 with the system interpreter (skipped when that is not possible).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import trl_agentic.tools as tools_pkg

SYSTEM_PYTHON = "/usr/bin/python3"
PACKAGE_ROOT = Path(tools_pkg.__file__).parent.parent


def modules_tools_imports() -> set[Path]:
    """The package's files that `trl_agentic.tools` imports, directly or not, outside its own folder: followed
    through the relative imports, so that the copy below never lags behind the code (it once missed a new module)."""
    seen: set[Path] = set()
    todo = list((PACKAGE_ROOT / "tools").rglob("*.py"))
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            target = base.joinpath(*node.module.split(".")) if node.module else base
            for candidate in (target.with_suffix(".py"), target / "__init__.py"):
                if candidate.exists() and candidate.resolve().is_relative_to(PACKAGE_ROOT.resolve()):
                    todo.append(candidate)
    return {path for path in seen if "tools" not in path.relative_to(PACKAGE_ROOT).parts}

SCRIPT = r"""
import json, os, socket, sys, time
from trl_agentic.tools import PythonSandbox, detect_sandbox_backend
report = {"uid": os.getuid(), "detected": detect_sandbox_backend()[0]}
for backend in ["bwrap", "subprocess"]:
    if backend == "bwrap" and report["detected"] != "bwrap":
        continue
    sb = PythonSandbox(backend=backend, pool_size=0, timeout=2, memory_mb=256, max_processes=8)
    iso = sb.isolation
    r = {"isolation": {k: getattr(iso, k) for k in ("network", "filesystem", "pid_namespace", "process_limit", "root")}}
    with sb.session() as s:
        s("x = 20")
        r["state"] = s("x + 1")
    r["fork"] = sb(
        "import os, time\nn = 0\nerr = ''\nfor _ in range(100):\n"
        "    try:\n        pid = os.fork()\n    except OSError as e:\n        err = type(e).__name__\n        break\n"
        "    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n    n += 1\nprint(n, err)")
    r["net"] = sb.invoke("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)").error
    r["home"] = sb("import os\nprint(os.path.exists(%r))" % os.path.realpath(sys.argv[1]))
    r["timeout"] = sb.invoke("while True: pass").timeout
    sb.close()
    report[backend] = r
print(json.dumps(report))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="already unprivileged: the other tests cover these paths")
@pytest.mark.skipif(
    not Path(SYSTEM_PYTHON).exists() or not shutil.which("setpriv"),
    reason="needs /usr/bin/python3 and setpriv to run as another user",
)
def test_sandbox_as_unprivileged_user():
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info >= (3, 10))"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "True":
        pytest.skip("the system interpreter is older than 3.10")
    tmp = tempfile.mkdtemp(prefix="trl_agentic_nonroot_")
    try:
        os.chmod(tmp, 0o755)
        package = Path(tmp) / "trl_agentic"
        package.mkdir()
        (package / "__init__.py").write_text("")
        shutil.copytree(
            Path(tools_pkg.__file__).parent, package / "tools", ignore=shutil.ignore_patterns("__pycache__")
        )
        for module in modules_tools_imports():
            if module != PACKAGE_ROOT / "__init__.py":
                destination = package / module.relative_to(PACKAGE_ROOT)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(module, destination)
        (Path(tmp) / "check.py").write_text(SCRIPT)
        secret_dir = tempfile.mkdtemp(prefix="trl_agentic_nonroot_home_")
        os.chmod(secret_dir, 0o777)
        subprocess.run(["chmod", "-R", "a+rX", tmp], check=True)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": tmp, "HOME": secret_dir}
        out = subprocess.run(
            [
                "setpriv",
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                SYSTEM_PYTHON,
                str(Path(tmp) / "check.py"),
                secret_dir,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd=tmp,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        report = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(secret_dir, ignore_errors=True)
    assert report["uid"] == 65534
    for backend in ("bwrap", "subprocess"):
        if backend not in report:
            continue
        r = report[backend]
        assert r["state"] == "21\n"
        assert r["timeout"] is True
        assert r["isolation"]["process_limit"] and not r["isolation"]["root"]
        n, err = r["fork"].split()
        # non-root: the limit is max_processes on top of the uid's tasks at start (the trainer, bwrap)
        assert int(n) < 16 and err == "BlockingIOError"
        if r["isolation"]["network"]:
            assert r["net"] is True
        if r["isolation"]["filesystem"]:
            assert r["home"] == "False\n"
    if report["detected"] == "bwrap":
        assert report["bwrap"]["isolation"]["filesystem"] and report["bwrap"]["isolation"]["pid_namespace"]
