import pytest
from conventions import build_convention


@pytest.fixture(scope="session")
def qwen():
    """The tiny Qwen2.5-Instruct convention: a real chat template with tools, and its response template."""
    return build_convention("qwen2.5-instruct")
