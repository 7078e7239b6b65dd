"""The two vLLM benchmarks at smoke size on a real vLLM engine (vLLM's CPU backend), run as a user types them
(``PYTHONPATH=. .venv-vllm/bin/python benchmarks/vllm_rollout.py ...``, in its own process), and what they print and
write checked: ``tests/test_benchmarks.py`` runs every other benchmark, and ``vllm_rollout.py``'s transformers side
alone, in the default suite."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_benchmarks import LEARNING, learning_inputs

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]\d+)?"


def _run(*argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"python {' '.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


def test_vllm_rollout(tmp_path):
    """Every side at one and two turns (head_dim 32, vLLM's CPU minimum): the float32 engines greedy-sample the
    transformers side's tokens, with its log-probs; a table row per turn count."""
    out = _run("benchmarks/vllm_rollout.py", "--turns", "1", "2", "--batch", "2", "--repeats", "1", "--hidden", "128",
               "--layers", "1", "--prompt-tokens", "16", "--observation-tokens", "8", "--tokens-per-turn", "4",
               "--json", str(tmp_path / "vllm_rollout.json"))
    results = json.loads((tmp_path / "vllm_rollout.json").read_text())["results"]
    assert [r["turns"] for r in results] == [1, 2]
    for r in results:
        assert set(r["median_s"]) == set(r["prefilled_tokens_per_trajectory"]) == {"hf", "vllm", "vllm-nocache",
                                                                                  "vllm-bf16"}
        assert r["same_streams"]["vllm"] and r["same_streams"]["vllm-nocache"]
        assert r["logprob_gap_vs_fp32_model"]["vllm"][1] < 1e-3
        assert len(r["logprob_gap_bf16_vs_bf16_model"]) == 2
    assert "| turns | hf s | vllm / hf | vllm-nocache / hf | vllm-bf16 / hf | prefilled/traj hf |" in out
    assert re.search(rf"^\| 2 \| {NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER} \| \d+ \| \d+ \| \d+ \| \d+ \| ", out,
                     re.M), out


def test_vllm_tool_loop(tmp_path):
    """TRL's tool loop and ours on one colocate engine, one step each: a table row per side, the ratios, and the
    per-step records."""
    out = _run("benchmarks/vllm_tool_loop.py", "--steps", "1", "--warmup", "0", "--batch", "2", "--num-generations",
               "2", "--iterations", "1", "--max-completion-length", "64", "--json", str(tmp_path / "steps.json"))
    records = json.loads((tmp_path / "steps.json").read_text())
    for side in ("trl", "ours"):
        (step,) = records[side]
        assert step["rows"] == 2 and step["tokens"] > 0 and step["rollout_s"] > 0 and step["step_s"] > 0
        assert re.search(rf"^\| {side} \| {NUMBER} \| {NUMBER} \| ", out, re.M), out
    assert re.search(rf"^ours / trl: rollout {NUMBER}, step {NUMBER}, rollout per token {NUMBER} \(medians over 1 "
                     r"steps per side\)$", out, re.M), out


def test_learning_native_speed_eval_on_vllm(tmp_path):
    """``speed.py eval`` with vLLM's engine beside transformers' cached generation, each in its own process, on the
    tiny tool model (hidden 128: vLLM's CPU minimum head of 32): a line per variant, the engine's setup apart, and
    the same prompt tokens in all (prefilled + reused) where the greedy conversations agree."""
    data, tiny, out = tmp_path / "onehop", tmp_path / "tiny", tmp_path / "speed"
    learning_inputs(data, tiny, hidden_size=128)
    shutil.copytree(tiny / "adapter", out / "sft" / "adapter")
    printed = _run("benchmarks/learning_native/speed.py", "eval", "--data", str(data), "--model", str(tiny / "model"),
                   *LEARNING, "--out", str(out), "--max-turns", "3", "--questions", "2", "--batch", "2",
                   "--variants", "cached", "vllm")
    assert re.search(rf"^eval cached: {NUMBER} s \({NUMBER} s of CPU\), EM ", printed, re.M), printed
    assert re.search(rf"^eval vllm: {NUMBER} s \({NUMBER} s of CPU; engine setup {NUMBER} s\), EM ", printed,
                     re.M), printed
    cached, vllm = json.loads((out / "speed_eval.json").read_text())["results"]
    assert (cached["variant"], vllm["variant"]) == ("cached", "vllm")
    assert vllm["setup_s"] > 0 and vllm["prefilled_tokens"] > 0
    if (cached["em"], cached["turns"], cached["decode_steps"]) == (vllm["em"], vllm["turns"], vllm["decode_steps"]):
        total = cached["prefilled_tokens"] - cached["shared_tokens"] + cached["reused_tokens"]
        assert vllm["prefilled_tokens"] + vllm["reused_tokens"] == total
    else:
        assert "vLLM's greedy conversations differ from transformers'" in printed
