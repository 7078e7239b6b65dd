import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# one torch thread per test process and per process it starts: the tiny models run as fast on one core as on two
# (tests/trainers measured the same wall time at half the CPU), so `pytest -n 2` runs two tests at once at full speed
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from conventions import CONVENTIONS  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(items):
    """Under ``pytest -n 2 --dist loadgroup`` (the README's command) each test file runs on one worker, so that a
    module's fixtures (a trained model, the benchmarks' shared pool of commands, which starts every selected test's
    commands) are built once, not once per worker; the tests that launch several processes (accelerate, gloo), each
    already keeping both cores busy, run one after another on one worker."""
    for item in items:
        group = "multiprocess" if item.get_closest_marker("multiprocess") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def tokenizer():
    from trl_agentic.toy import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tokenizer, tmp_path_factory):
    """A tiny Qwen2 and its tokenizer saved to disk (full fine-tuning with a reference model needs a path)."""
    from trl_agentic.toy import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-qwen2")
    build_tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def tiny_model(tokenizer):
    from trl_agentic.toy import build_tiny_model

    return build_tiny_model(tokenizer)


@pytest.fixture(params=CONVENTIONS)
def convention(request):
    """Each real-model convention (tests/conventions.py): a tiny model directory plus its ids and template traits."""
    from conventions import build_convention

    return build_convention(request.param)


@pytest.fixture(scope="session")
def gemma3_270m():
    """The real Gemma-3-270M from the PyPI GGUF package, as a Convention (tests using it must be marked slow)."""
    from conventions import gemma3_270m_gguf, require_gemma3_270m

    require_gemma3_270m()
    return gemma3_270m_gguf()


@pytest.fixture(autouse=True)
def _mask_audit_must_be_zero(monkeypatch):
    """Any trainer in any test that logs a non-zero ``agentic/mask_audit`` (a trained token the model did not
    sample) fails that test."""
    from trl_agentic.compat import GRPOTrainerBoundary

    original = GRPOTrainerBoundary.add_metrics

    def checked(self, metrics):
        value = metrics.get("agentic/mask_audit", 0)
        assert value == 0, f"agentic/mask_audit = {value}: trained positions the model did not sample"
        return original(self, metrics)

    monkeypatch.setattr(GRPOTrainerBoundary, "add_metrics", checked)
