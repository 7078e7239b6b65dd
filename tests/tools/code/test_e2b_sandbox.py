"""E2BSandbox: the service is unreachable here, so the mapping is tested against a fake ``Sandbox`` class with
the e2b-code-interpreter interface (``Sandbox.create(...)``, ``run_code(code, timeout=...) -> Execution``,
``kill()``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from trl_agentic.tools import E2BSandbox, SandboxError


class FakeTimeoutException(Exception):
    """Named like e2b's TimeoutException."""


FakeTimeoutException.__name__ = "TimeoutException"


class FakeSandbox:
    created: list["FakeSandbox"] = []
    fail_create = False

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.namespace: dict = {}
        self.killed = False
        self.calls: list[tuple[str, float]] = []

    @classmethod
    def create(cls, **kwargs):
        if cls.fail_create:
            raise ConnectionError("[Errno 111] Connection refused")
        sandbox = cls(**kwargs)
        cls.created.append(sandbox)
        return sandbox

    def run_code(self, code, timeout=None):
        self.calls.append((code, timeout))
        if code == "SLOW":
            raise FakeTimeoutException(
                "Execution timed out — the 'timeout' option can be used to increase this timeout"
            )
        if code == "DISCONNECT":
            raise OSError("connection reset")
        stdout, stderr, text, error = [], [], None, None
        if code.startswith("x ="):
            self.namespace["x"] = int(code.split("=")[1])
        elif code == "x":
            text = str(self.namespace.get("x"))
            if "x" not in self.namespace:
                text = None
                error = SimpleNamespace(
                    name="NameError",
                    value="name 'x' is not defined",
                    traceback="\x1b[0;31m---------\x1b[0m\nNameError: name 'x' is not defined",
                )
        elif code.startswith("print"):
            stdout = ["hello\n", "world\n"]
            stderr = ["warning!\n"]
        elif code == "1/0":
            error = SimpleNamespace(
                name="ZeroDivisionError",
                value="division by zero",
                traceback="Cell In[3], line 1\n----> 1 1/0\n\x1b[1;31mZeroDivisionError\x1b[0m: division by zero",
            )
        return SimpleNamespace(logs=SimpleNamespace(stdout=stdout, stderr=stderr), error=error, text=text, results=[])

    def kill(self):
        self.killed = True
        return True


@pytest.fixture(autouse=True)
def reset_fake():
    FakeSandbox.created = []
    FakeSandbox.fail_create = False
    yield


def test_missing_api_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(ValueError, match="E2B_API_KEY"):
        E2BSandbox(sandbox_cls=FakeSandbox)


def test_missing_api_key_with_the_real_sdk(monkeypatch):
    pytest.importorskip("e2b_code_interpreter")
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(ValueError, match="E2B_API_KEY"):
        E2BSandbox()


def test_session_maps_results_and_keeps_state(monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "e2b_test_key")
    sb = E2BSandbox(sandbox_cls=FakeSandbox, timeout=7, template="my-template")
    with sb.session() as session:
        assert FakeSandbox.created == []  # created lazily
        assert session("x = 41") == ""
        assert session("x") == "41\n"
        assert session.last_result.ok
        remote = FakeSandbox.created[0]
        assert remote.kwargs["api_key"] == "e2b_test_key" and remote.kwargs["template"] == "my-template"
        assert remote.kwargs["allow_internet_access"] is False
        assert remote.calls[0] == ("x = 41", 7.0)
        text = session("print('hi')")
        assert text == "hello\nworld\nwarning!\n"
        assert session.last_result.stdout == "hello\nworld\n" and session.last_result.stderr == "warning!\n"
        err = session.invoke("1/0")
        assert err.error and "ZeroDivisionError: division by zero" in err.observation
        assert "\x1b[" not in err.observation
        assert len(FakeSandbox.created) == 1
    assert remote.killed and session.closed
    assert "closed" in session("x")


def test_fenced_code_is_extracted(monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "k")
    sb = E2BSandbox(sandbox_cls=FakeSandbox)
    with sb.session() as session:
        session("```python\nx = 3\n```")
        assert FakeSandbox.created[0].calls[0][0] == "x = 3"


def test_timeout_restarts_remote_sandbox(monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "k")
    sb = E2BSandbox(sandbox_cls=FakeSandbox, timeout=2)
    with sb.session() as session:
        session("x = 1")
        out = session.invoke("SLOW")
        assert out.timeout and out.error and "TimeoutError: execution exceeded 2 s" in out.observation
        assert "lost" in out.observation
        assert FakeSandbox.created[0].killed
        assert "NameError" in session("x")  # a fresh remote sandbox
        assert len(FakeSandbox.created) == 2 and session.num_restarts == 1 and session.num_timeouts == 1
        dropped = session.invoke("DISCONNECT")
        assert dropped.error and not dropped.timeout and "connection reset" in dropped.observation


def test_unreachable_service_is_an_error_observation(monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "k")
    FakeSandbox.fail_create = True
    sb = E2BSandbox(sandbox_cls=FakeSandbox)
    out = sb.invoke("print(1)")
    assert out.error and "could not create an E2B sandbox" in out.observation and "E2B_API_KEY" in out.observation
    with pytest.raises(SandboxError, match="check failed"):
        sb.check()


def test_check_and_async(monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "k")

    class OkSandbox(FakeSandbox):
        def run_code(self, code, timeout=None):
            return SimpleNamespace(logs=SimpleNamespace(stdout=["ok\n"], stderr=[]), error=None, text=None)

    sb = E2BSandbox(sandbox_cls=OkSandbox)
    sb.check()
    assert OkSandbox.created[-1].killed
    assert asyncio.run(sb.acall("print('ok')")) == "ok\n"


def test_real_sdk_unreachable_service_becomes_error_text(monkeypatch):
    """With the real SDK and a bogus domain, creating the sandbox fails fast and becomes an observation."""
    pytest.importorskip("e2b_code_interpreter")
    monkeypatch.setenv("E2B_API_KEY", "e2b_" + "0" * 40)
    monkeypatch.setenv("E2B_API_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("E2B_CONNECTION_RETRIES", "0")
    sb = E2BSandbox(request_timeout=2, create_kwargs={"retries": 0})
    out = sb.invoke("print(1)")
    assert out.error and "could not create an E2B sandbox" in out.observation and "127.0.0.1:9" in out.observation
