"""The package surface: every exported name resolves, and importing the package loads no optional extra."""

import subprocess
import sys

import trl_agentic

SURFACE = {
    "AgenticGRPOTrainer", "AgenticGRPOConfig", "AgenticPPOTrainer", "AgenticPPOConfig",
    "Environment", "StepResult", "TagEnvironment", "TagProtocol", "Trajectory", "RolloutConfig", "run_rollouts",
}


def test_the_top_level_is_what_a_user_types():
    """About a dozen names; the rest by module path (a name added here is a decision, not an accident)."""
    assert set(trl_agentic.__all__) == SURFACE | {"__version__"}
    for name in SURFACE:
        assert getattr(trl_agentic, name) is not None, name
    assert "sft_dataset" not in dir(trl_agentic) and not hasattr(trl_agentic, "Calculator")


def test_import_loads_no_optional_extra():
    code = (
        "import sys, trl_agentic, trl_agentic.tools, trl_agentic.rewards, trl_agentic.tasks,"
        " trl_agentic.tools.retrieval.server;"
        "bad = [m for m in ('vllm', 'bitsandbytes', 'e2b_code_interpreter', 'bm25s', 'faiss', 'math_verify', 'trl',"
        " 'fastapi', 'uvicorn', 'starlette')"
        " if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_deprecated_aliases():
    """Nothing was released: the names before the renames are gone, and passing them fails loudly."""
    import pytest

    import trl_agentic.rewards
    from trl_agentic.environments.base import StepResult
    from trl_agentic.rollout.config import RolloutConfig

    with pytest.raises(TypeError, match="done"):
        StepResult(done=True)
    with pytest.raises(TypeError, match="mode"):
        RolloutConfig(mode="chat")
    with pytest.raises(TypeError, match="stop"):
        RolloutConfig(stop=["</a>"])
    assert not hasattr(trl_agentic.rewards, "TagSpec")
