"""A run prints only what a user can act on (trl_agentic/quiet.py): the lines of the libraries that no change of the
user's script removes are gone from a real run's output, and each of them is shown to appear without the filter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "recipes" / "fixtures"
GEMM_LINE = "Failed to load CPU gemm_4bit_forward from kernels-community"
CHECKPOINTING = "gradient_checkpointing` is deprecated"  # three FutureWarnings of transformers 5, one per name
HASHING = "couldn't be hashed properly"

# Runs the rest of the command line as a script, on a CPU that bitsandbytes takes for one with AVX512-BF16: there it
# tries the optional `kernels` package at import and logs GEMM_LINE when it cannot (the line the issue saw).
AVX512_BF16 = """
import importlib.abc, importlib.machinery, runpy, sys

class AVX512BF16(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "bitsandbytes.functional":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        execute = spec.loader.exec_module
        def exec_module(module):
            execute(module)
            module.has_avx512bf16 = lambda: True
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, AVX512BF16())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, "-c", AVX512_BF16, str(script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_lines_appear_without_the_filter(tmp_path):
    """The control: bitsandbytes imported on its own logs the gemm line, and a TrainingArguments with
    gradient_checkpointing warns; trl_agentic not imported, nothing filters them."""
    pytest.importorskip("bitsandbytes")
    script = tmp_path / "plain.py"
    script.write_text("import bitsandbytes\nfrom transformers import TrainingArguments\n"
                      "TrainingArguments(output_dir='out', use_cpu=True, gradient_checkpointing=True)\n")
    proc = _run(script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert GEMM_LINE in proc.stderr and CHECKPOINTING in proc.stderr


def test_a_recipe_run_prints_no_unactionable_line(tiny_model_dir, tmp_path):
    """One step of recipes/gsm8k_tools.py from its YAML config (gradient checkpointing on, as the config has it),
    with the evaluation before and after: none of the lines is printed."""
    pytest.importorskip("bitsandbytes")
    proc = _run(REPO / "recipes" / "gsm8k_tools.py", "--config", str(REPO / "recipes/configs/gsm8k_tools_grpo.yaml"),
                "--model_name_or_path", tiny_model_dir, "--dataset_name", str(FIXTURES / "gsm8k_small.jsonl"),
                "--tool", "calculator", "--use_peft", "false", "--max_steps", "1", "--per_device_train_batch_size",
                "4", "--num_generations", "2", "--max_turns", "2", "--max_tokens_per_turn", "16",
                "--max_completion_length", "48", "--max_eval_samples", "2", "--per_device_eval_batch_size", "2",
                "--save_strategy", "no", "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "'loss'" in output and "saved to" in output  # it trained
    for line in (GEMM_LINE, CHECKPOINTING, HASHING, "FutureWarning"):
        assert line not in output, f"{line!r} is printed:\n{output[-3000:]}"


def test_task_rows_do_not_make_datasets_hash_the_task(tokenizer, monkeypatch):
    """A task holding something that does not pickle (a live connection, a worker pool): datasets' map would try to
    fingerprint its function and warn that it "couldn't be hashed" on every run."""
    import logging

    import datasets.fingerprint

    from trl_agentic.tasks import GSM8KToolsArguments, build_task, load_rows

    monkeypatch.setattr(datasets.fingerprint, "fingerprint_warnings", {})  # datasets warns once per process
    logged: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logged.append(record.getMessage())
    datasets_logger = logging.getLogger("datasets")  # its records do not propagate to the root logger

    class LiveConnection:
        def __reduce__(self):
            raise TypeError("cannot pickle a live connection")

    datasets_logger.addHandler(handler)
    try:
        with build_task("gsm8k_tools", GSM8KToolsArguments(tool="calculator")) as task:
            task.resources.append(LiveConnection())
            rows = task.rows(load_rows(str(FIXTURES / "gsm8k_small.jsonl")), tokenizer)
            task.resources.clear()
    finally:
        datasets_logger.removeHandler(handler)
    assert len(rows) == 8 and rows[0]["prompt"][-1]["role"] == "user"
    assert not [message for message in logged if HASHING in message], logged
