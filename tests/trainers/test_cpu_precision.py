"""On a CPU (``use_cpu=True``, or no GPU at all) our configs leave TRL's default ``bf16=True`` unset: float32, the same
numbers on every CPU; bfloat16 autocast makes every step several times slower on a CPU without bfloat16 in hardware
(docs/trl-differences.md). A value the user gives is kept, with a warning only where it is slow."""

from __future__ import annotations

import pytest
import torch

from trl_agentic import AgenticGRPOConfig, AgenticPPOConfig


@pytest.mark.parametrize("config_class", [AgenticGRPOConfig, AgenticPPOConfig])
def test_use_cpu_trains_in_float32_unless_bf16_is_asked_for(config_class, tmp_path, recwarn, monkeypatch):
    from trl import GRPOConfig

    from trl_agentic import device

    assert GRPOConfig(output_dir=str(tmp_path), use_cpu=True).bf16  # TRL's default, the difference we document
    assert config_class(output_dir=str(tmp_path), use_cpu=True).bf16 is False
    assert not [w for w in recwarn if "bf16" in str(w.message)]  # the default says nothing
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="bf16=True on a CPU without bfloat16 in hardware"):
        assert config_class(output_dir=str(tmp_path), use_cpu=True, bf16=True).bf16 is True
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)  # AVX512-BF16 or AMX: asked for, and fast
    assert config_class(output_dir=str(tmp_path), use_cpu=True, bf16=True).bf16 is True
    assert not [w for w in recwarn if "bf16" in str(w.message)]
    assert config_class(output_dir=str(tmp_path), use_cpu=True, fp16=False, bf16=False).bf16 is False


def test_native_bf16_is_what_torch_detects(monkeypatch):
    from trl_agentic import device

    assert device.cpu_has_native_bf16() is (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")  # a torch without the private check: not claimed
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert device.cpu_has_native_bf16() is False


def test_without_a_gpu_the_config_runs_on_the_cpu_instead_of_refusing(tmp_path, monkeypatch):
    """TRL's bf16=True with no GPU and no use_cpu is transformers' "Your setup doesn't support bf16/gpu"; ours picks
    float32, and training goes to the CPU, where transformers puts it when there is no GPU."""
    from trl import GRPOConfig

    from trl_agentic import device

    monkeypatch.setattr(device, "has_accelerator", lambda: False)
    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: False)
    with pytest.raises(ValueError, match="doesn't support bf16/gpu"):
        GRPOConfig(output_dir=str(tmp_path))
    config = AgenticGRPOConfig(output_dir=str(tmp_path))
    assert config.bf16 is False and not config.use_cpu
    if not torch.cuda.is_available():
        assert config.device.type == "cpu"


def test_with_a_gpu_the_default_is_trls(tmp_path, monkeypatch):
    from trl_agentic import device

    monkeypatch.setattr(device, "has_accelerator", lambda: True)
    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    assert AgenticGRPOConfig(output_dir=str(tmp_path)).bf16 is True
