"""The TRL boundary holds, and every contact with TRL is listed.

- Private names of TRL's GRPOTrainer / transformers' Trainer, and imports from TRL's internal modules, appear only in
  trl_agentic/compat.py, and only those in ``PRIVATE_IN_BOUNDARY``.
- Every attribute of the trainer that TRL (or transformers) defines and that our code reads, on ``self`` inside a
  trainer class or on a ``trainer`` object anywhere, is in ``TRL_ATTRIBUTES_READ``; every one our trainers assign
  is in ``TRL_ATTRIBUTES_WRITTEN`` (one writer per attribute: TRL's, unless listed).
- Every method of a trainer class that overrides a TRL / Trainer method is in ``OVERRIDES`` (public ones too:
  ``create_optimizer``, ``save_model``, ...); private overrides live in the boundary.

The lists are parsed from TRL's and transformers' sources (``self.<name> = ...`` and ``def <name>``), so a TRL
release that adds an attribute our code already uses makes this test name it.
"""

import ast
import re
from pathlib import Path

import transformers
import trl

PACKAGE = Path(__file__).resolve().parents[1] / "trl_agentic"
BOUNDARY = PACKAGE / "compat.py"
TRL_SOURCES = (
    Path(trl.__file__).parent / "trainer" / "grpo_trainer.py",
    Path(trl.__file__).parent / "trainer" / "base_trainer.py",
    Path(transformers.__file__).parent / "trainer.py",
)
TRAINER_BASES = {"GRPOTrainer", "GRPOTrainerBoundary", "AgenticTrainer", "AgenticGRPOTrainer", "AgenticPPOTrainer"}

# Public attributes of GRPOTrainer / Trainer our code reads (config fields read on the config are not here).
TRL_ATTRIBUTES_READ = {
    # transformers' Trainer
    "args", "model", "model_wrapped", "accelerator", "state", "optimizer", "processing_class", "train_dataset",
    "current_gradient_accumulation_steps", "is_world_process_zero", "add_callback", "remove_callback", "train",
    "save_model", "create_model_card", "push_to_hub", "create_optimizer", "training_step",
    # GRPOTrainer
    "beta", "loss_type", "epsilon_low", "epsilon_high", "importance_sampling_level", "max_completion_length",
    "num_generations", "num_generations_eval", "num_iterations", "scale_rewards", "multi_objective_aggregation",
    "reward_weights", "reward_func_names", "eos_token_ids", "generation_config", "use_vllm", "vllm_generation",
    "aux_loss_enabled", "ref_model", "pad_to_multiple_of", "environments",
}
TRL_ATTRIBUTES_WRITTEN = {
    "model_wrapped",  # end_training frees the distributed wrapper (compat.GRPOTrainerBoundary.end_training)
    "_buffered_inputs",  # compat._prepare_inputs, as TRL's own _prepare_inputs
    # TRL's tools= / environment_factory= run by our engine, TRL's tool loop never does: we set what TRL would
    "tools",  # the standalone tools and every environment's methods (TRL's __init__), read by TRL's metrics code
    "environments",  # this process's rollouts' environment instances (TRL's _generate_and_score_completions)
}
PRIVATE_IN_BOUNDARY = {
    "_generate_and_score_completions", "_compute_loss", "_get_per_token_logps_and_entropies", "_calculate_rewards",
    "_prepare_inputs", "_clip_grad_norm", "_metrics", "_step", "_buffered_inputs", "_dist",
    "_log_completion_extra",  # log_completion_columns: the multi-turn columns of the completions table (trackers.py)
    "_logs", "_pending_extra_logs", "_pending_metrics",  # log_round_table: TRL's completions table, our round
}
OVERRIDES = {
    "GRPOTrainerBoundary": {"__init__", "_generate_and_score_completions", "_compute_loss", "_prepare_inputs",
                            "_clip_grad_norm", "end"},
    "AgenticTrainer": {"__init__", "create_model_card", "train"},
    "AgenticPPOTrainer": {"__init__", "training_step", "create_optimizer", "save_model"},
}


def _trl_names() -> set[str]:
    names: set[str] = set()
    for path in TRL_SOURCES:
        text = path.read_text()
        names |= set(re.findall(r"self\.(\w+)\s*(?::[^=\n]*)?=(?!=)", text))
        names |= set(re.findall(r"^    def (\w+)\(", text, re.MULTILINE))
    return names


def _trainer_classes(tree: ast.AST) -> list[ast.ClassDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
            and any(isinstance(b, ast.Name) and b.id in TRAINER_BASES for b in n.bases)]


def _is_trainer_ref(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "trainer") or (
        isinstance(node, ast.Attribute) and node.attr == "trainer")


def offenders(sources: dict[Path, str]) -> list[str]:
    """Every contact with TRL that the lists above do not allow, as ``path:line: what``."""
    trl = _trl_names()
    found = []
    for path, source in sources.items():
        where = path.relative_to(PACKAGE.parent) if PACKAGE.parent in path.parents else path
        in_boundary = path == BOUNDARY
        tree = ast.parse(source)

        def report(node: ast.AST, what: str) -> None:
            found.append(f"{where}:{node.lineno}: {what}")

        def check_private(node: ast.AST, name: str) -> None:
            if name.startswith("_") and not name.startswith("__") and name in trl:
                if not in_boundary or name not in PRIVATE_IN_BOUNDARY:
                    report(node, f"private .{name}")

        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[1].value, str) and (_is_trainer_ref(node.args[0]) or (
                        isinstance(node.args[0], ast.Name) and node.args[0].id == "self"))):
                check_private(node, node.args[1].value)
            if isinstance(node, ast.ImportFrom) and node.module and re.match(r"trl\.(?!__)", node.module):
                if not in_boundary:
                    report(node, f"from {node.module} import")
            if isinstance(node, ast.Attribute) and _is_trainer_ref(node.value):
                check_private(node, node.attr)
                if node.attr in trl and not node.attr.startswith("_") and node.attr not in TRL_ATTRIBUTES_READ:
                    report(node, f"reads trainer.{node.attr}")
        for cls in _trainer_classes(tree):
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name in trl:
                    if item.name not in OVERRIDES.get(cls.name, set()) or (
                            item.name.startswith("_") and not item.name.startswith("__") and not in_boundary):
                        report(item, f"{cls.name} overrides {item.name}")
            for node in ast.walk(cls):
                if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"):
                    continue
                name = node.attr
                check_private(node, name)
                if name not in trl:
                    continue
                if isinstance(node.ctx, ast.Store) and name not in TRL_ATTRIBUTES_WRITTEN:
                    report(node, f"writes self.{name}")
                elif isinstance(node.ctx, ast.Load) and not name.startswith("_") and name not in TRL_ATTRIBUTES_READ:
                    report(node, f"reads self.{name}")
    return found


def _ours() -> dict[Path, str]:
    return {p: p.read_text() for p in PACKAGE.rglob("*.py")}


def test_every_contact_with_trl_is_listed():
    found = offenders(_ours())
    assert found == [], "TRL contacts not in tests/test_boundary.py's lists:\n" + "\n".join(found)


def test_the_lists_hold_only_names_trl_has():
    """A stale entry (TRL renamed the attribute) is an error too."""
    trl = _trl_names()
    listed = TRL_ATTRIBUTES_READ | TRL_ATTRIBUTES_WRITTEN | PRIVATE_IN_BOUNDARY | set().union(*OVERRIDES.values())
    assert sorted(listed - trl) == []


def test_the_check_can_fail():
    sources = _ours()
    sources[PACKAGE / "fake.py"] = (
        'from trl.trainer.utils import nanstd\n"""self._metrics in a docstring is fine"""\n'
        "def f(trainer):\n    return trainer._metrics, trainer.args, trainer.reward_processing_classes\n"
        "def g(trainer):\n    return getattr(trainer, '_logs', None)\n"
        "class T(AgenticGRPOTrainer):\n"
        "    def compute_loss(self, model, inputs):\n        self.beta = 0.0\n        return self.temperature\n"
    )
    found = [f for f in offenders(sources) if f.startswith("trl_agentic/fake.py")]
    assert sorted(found) == sorted([
        "trl_agentic/fake.py:1: from trl.trainer.utils import",
        "trl_agentic/fake.py:4: private ._metrics",
        "trl_agentic/fake.py:4: reads trainer.reward_processing_classes",
        "trl_agentic/fake.py:6: private ._logs",
        "trl_agentic/fake.py:8: T overrides compute_loss",
        "trl_agentic/fake.py:9: writes self.beta",
        "trl_agentic/fake.py:10: reads self.temperature",
    ])
