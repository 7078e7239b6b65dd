"""Where a run trains when the user did not say, and in which precision.

TRL's configs default to ``bf16=True``. On a GPU that is the fast choice; on a CPU without bfloat16 in hardware,
bfloat16 autocast makes every step several times slower than float32, on one with it (AVX512-BF16 or AMX) somewhat
faster (docs/trl-differences.md); without ``use_cpu`` transformers refuses it outright. :func:`cpu_bf16_default` is
what our configs use instead while ``bf16`` is unset: float32, the same numbers on every CPU.
"""

from __future__ import annotations

import warnings


def has_accelerator() -> bool:
    """Whether torch sees a GPU (CUDA or ROCm), an Intel XPU or Apple's MPS."""
    import torch

    xpu = getattr(torch, "xpu", None)
    return (torch.cuda.is_available() or (xpu is not None and xpu.is_available())
            or torch.backends.mps.is_available())


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX tiles, as torch detects them), where
    bfloat16 autocast is faster than float32 rather than several times slower."""
    import torch

    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def cpu_bf16_default(bf16: bool | None, fp16: bool, use_cpu: bool) -> bool | None:
    """``bf16`` as our configs resolve it before TRL does: left unset it becomes ``False`` when the run is on a CPU
    (``use_cpu``, or no accelerator); else it is returned as given (``None``: TRL's default, ``not fp16``). An
    explicit ``bf16=True`` on a CPU is kept, with a warning that says what it costs where the CPU has no bfloat16 in
    hardware (:func:`cpu_has_native_bf16`)."""
    on_cpu = use_cpu or not has_accelerator()
    if bf16 is None and not fp16 and on_cpu:
        return False
    if bf16 and on_cpu and not cpu_has_native_bf16():
        warnings.warn("bf16=True on a CPU without bfloat16 in hardware (AVX512-BF16 or AMX): bfloat16 autocast makes "
                      "each training step several times slower than float32 (docs/trl-differences.md); pass "
                      "bf16=False unless you mean it", stacklevel=4)
    return bf16
