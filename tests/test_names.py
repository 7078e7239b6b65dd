"""One name per concept, checked over the package's source (docs/design.md, "Names"): a synonym that creeps back in
fails here, naming the file, the line and the name to use instead."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from trl_agentic.environments.base import StepResult
from trl_agentic.trajectory import STOP_REASONS, TRUNCATING

PACKAGE = Path(__file__).resolve().parents[1] / "trl_agentic"
# compat.py belongs to the trainer redesign (issue 21, B1): its vLLM generator still names the seam's parameter
# stop_token_ids; the generator moves next to the seam there, under the name checked here.
END_ID_EXEMPT: set[str] = set()
# vLLM's own SamplingParams keyword, passed through as is
VLLM_KEYWORD = re.compile(r"stop_token_ids=list\(|\"stop_token_ids\": list\(")
END_ID_SYNONYMS = re.compile(r"\b(end_token_ids|stop_token_ids|eos_ids|end_ids)\b")
# the only modules that hold TRL's batch, where completion_mask is TRL's mask of real (non-padding) completion positions
TRL_BATCH_MODULES = ("compat.py", "trainers/")


def _sources() -> list[tuple[str, str]]:
    return [(str(p.relative_to(PACKAGE)), p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))]


def _public_functions(tree: ast.AST):
    """Functions and methods a user calls: not underscored (``__init__`` counts), not in an underscored class."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name.startswith("_"):
            continue
        bodies = node.body if isinstance(node, (ast.ClassDef, ast.Module)) else []
        for item in bodies:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not item.name.startswith("_") or item.name == "__init__"):
                yield item


def _parameters(function) -> list[str]:
    args = function.args
    return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]


def test_end_ids_are_eos_token_ids():
    """TRL's ``eos_token_ids``: every id that ends the model's generation."""
    found = []
    for path, text in _sources():
        if path in END_ID_EXEMPT:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for match in END_ID_SYNONYMS.finditer(VLLM_KEYWORD.sub("", line)):
                found.append(f"{path}:{n}: {match.group(0)} -> eos_token_ids")
    assert not found, "\n".join(found)


def test_processing_class_not_tokenizer_in_public_signatures():
    """TRL's ``processing_class`` (a tokenizer or a processor), in every public signature that takes one."""
    allowed = {("toy/model.py", "build_tiny_model")}  # sizes a model from a tokenizer's vocabulary: a tokenizer
    found = [f"{path}:{f.lineno}: {f.name}(tokenizer) -> processing_class"
             for path, text in _sources() for f in _public_functions(ast.parse(text))
             if "tokenizer" in _parameters(f) and (path, f.name) not in allowed]
    assert not found, "\n".join(found)


def test_success_threshold_not_threshold():
    found = [f"{path}:{node.lineno}: {node.name}(threshold) -> success_threshold"
             for path, text in _sources() for node in ast.walk(ast.parse(text))
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "threshold" in _parameters(node)]
    assert not found, "\n".join(found)


def test_completion_mask_is_trl_padding_mask_only():
    """``completion_mask`` is TRL's mask of real completion positions and lives with TRL's batch; the positions a loss
    trains are a ``loss_mask``."""
    found = []
    for path, text in _sources():
        if path.startswith(TRL_BATCH_MODULES):
            continue
        for node in ast.walk(ast.parse(text)):
            name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                    else node.arg if isinstance(node, (ast.arg, ast.keyword)) else
                    node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
            if name == "completion_mask":
                found.append(f"{path}:{node.lineno}: completion_mask outside TRL's batch -> loss_mask")
    assert not found, "\n".join(found)


def test_truncated_has_one_meaning():
    """``truncated``: the episode did not end on its own (Gymnasium's sense). One stop reason is the environment's
    (``env_truncated``); ``Trajectory.truncated`` covers it and the budgets and failures; a shortened text is
    ``observation_truncated`` / ``output_truncated``. ``StepResult.truncated`` is the only field of that name."""
    assert "truncated" not in STOP_REASONS and "env_truncated" in STOP_REASONS
    assert TRUNCATING == set(STOP_REASONS) - {"terminated", "eos"}
    fields = [f"{path}:{node.name}" for path, text in _sources() for node in ast.walk(ast.parse(text))
              if isinstance(node, ast.ClassDef) for item in node.body
              if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) == "truncated"]
    assert fields == ["environments/base.py:StepResult"], fields
    assert StepResult(truncated=True).truncated


MASK_SYNONYMS = re.compile(r"\b(tool_mask|fmask|agent_mask|sampled_mask)\b")


def test_the_sampled_token_mask_is_env_mask():
    """1 at a token the model sampled, 0 at an observation token: ``env_mask`` everywhere; TRL's batch calls it
    ``tool_mask``, a key only ``compat.TRLBatch`` and the batch builder write (``trainers/base.py``)."""
    allowed = {"compat.py", "trainers/base.py"}
    found = [f"{path}:{n}: {match.group(0)} -> env_mask"
             for path, text in _sources() if path not in allowed
             for n, line in enumerate(text.splitlines(), 1) for match in MASK_SYNONYMS.finditer(line)]
    assert not found, "\n".join(found)


def test_the_check_can_fail(tmp_path):
    """The patterns catch what they are meant to catch."""
    assert END_ID_SYNONYMS.search("def f(end_token_ids): ...") and not END_ID_SYNONYMS.search(
        VLLM_KEYWORD.sub("", "SamplingParams(stop_token_ids=list(eos_token_ids))"))
    tree = ast.parse("class A:\n    def __init__(self, tokenizer): ...\nclass _B:\n    def f(self, tokenizer): ...")
    assert [f.name for f in _public_functions(tree) if "tokenizer" in _parameters(f)] == ["__init__"]
    assert MASK_SYNONYMS.search("fmask = mask.float()") and not MASK_SYNONYMS.search("env_mask = ...")
