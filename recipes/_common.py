"""Pieces shared by the recipes: command-line options, hardware checks, model/LoRA/QLoRA/vLLM settings, data loading.

Not part of the ``trl_agentic`` package: the recipes are scripts (``python recipes/gsm8k_tools.py``) and import this
file from their own folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class RecipeError(RuntimeError):
    """A configuration the recipe refuses, with the reason and the fix. ``main()`` prints it and exits with 2."""


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def ppo_available() -> bool:
    """Whether ``AgenticPPOTrainer`` can be imported (``--algo ppo``)."""
    try:
        from trl_agentic.trainers.ppo import AgenticPPOConfig, AgenticPPOTrainer  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means PPO is not usable here
        return False
    return True


def add_common_args(parser: argparse.ArgumentParser, *, defaults: dict[str, Any]) -> None:
    """Options every recipe has. ``defaults`` sets the recipe's own defaults (model, lengths, lr...)."""
    d = defaults
    g = parser.add_argument_group("model and data")
    g.add_argument("--model", default=d["model"],
                   help="hub id or local directory of the policy (default: %(default)s)")
    g.add_argument("--dataset-path", default=None,
                   help="local data instead of the hub: a .jsonl/.json/.parquet file, a folder with "
                        "<split>.jsonl or <split>.parquet, or a folder written by Dataset.save_to_disk")
    g.add_argument("--dataset-split", default="train", help="split to train on (default: %(default)s)")
    g.add_argument("--max-train-samples", type=int, default=None, help="keep only the first N training rows")
    g.add_argument("--output-dir", default=d["output_dir"], help="checkpoints and logs (default: %(default)s)")

    g = parser.add_argument_group("algorithm")
    algos = ["grpo", "ppo"] if ppo_available() else ["grpo"]
    g.add_argument("--algo", choices=algos, default="grpo",
                   help="grpo: AgenticGRPOTrainer (group baseline); ppo: AgenticPPOTrainer (learned critic, GAE, "
                        "KL in the reward)" + ("" if "ppo" in algos else " [ppo unavailable: it does not import]"))
    g.add_argument("--max-steps", type=int, default=d.get("max_steps", 500), help="optimizer steps (default: %(default)s)")
    g.add_argument("--learning-rate", type=float, default=None,
                   help=f"default {d['lr_full']:g} for full fine-tuning, {d['lr_lora']:g} with --use-lora")
    g.add_argument("--num-generations", type=int, default=None,
                   help=f"completions per prompt (GRPO group size; default {d['num_generations']} for grpo, 1 for ppo)")
    g.add_argument("--per-device-train-batch-size", type=int, default=None,
                   help="completions per device per optimizer step (default: --num-generations x 2 for grpo)")
    g.add_argument("--gradient-accumulation-steps", type=int, default=1)
    g.add_argument("--beta", type=float, default=d["beta"],
                   help="KL coefficient against the reference model: in the loss for grpo, in the per-token reward "
                        "(kl_coef) for ppo (default: %(default)s)")
    g.add_argument("--kl-estimator", choices=["k1", "k2", "k3"], default=None,
                   help="KL estimator (default: k3 for grpo, TRL's own path; k1 for ppo)")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--loss-type", default=None, help="TRL loss_type (default: TRL's, 'dapo')")
    g.add_argument("--mask-truncated-trajectories", action="store_true",
                   help="exclude trajectories that ran out of turns or tokens from the loss")
    g.add_argument("--critic-learning-rate", type=float, default=None, help="ppo only (default: 10 x --learning-rate)")
    g.add_argument("--critic", choices=["separate", "shared"], default="separate",
                   help="ppo only: a separate value model, or a value head over the policy (default: %(default)s)")

    g = parser.add_argument_group("multi-turn rollouts")
    g.add_argument("--rollout-mode", choices=["text", "chat"], default=d["rollout_mode"],
                   help="text: observations continue the assistant's text (one assistant turn per episode); chat: each "
                        "observation is a tool message rendered by the chat template (default: %(default)s)")
    g.add_argument("--max-turns", type=int, default=d["max_turns"],
                   help="most model turns per trajectory (default: %(default)s)")
    g.add_argument("--max-tokens-per-turn", type=int, default=d["max_tokens_per_turn"],
                   help="most tokens sampled in one turn (default: %(default)s)")
    g.add_argument("--max-completion-length", type=int, default=d["max_completion_length"],
                   help="budget of a whole trajectory, sampled and observation tokens (default: %(default)s)")
    g.add_argument("--max-observation-tokens", type=int, default=d["max_observation_tokens"],
                   help="observations are cut to this many tokens (default: %(default)s)")
    g.add_argument("--env-timeout", type=float, default=60.0, help="seconds per environment step")
    g.add_argument("--trajectory-dir", default=None,
                   help="save every rollout as JSONL here (render: python -m trl_agentic.render FILE)")

    g = parser.add_argument_group("memory and speed")
    g.add_argument("--use-lora", action="store_true", help="train a LoRA adapter (r=16 on all linear layers)")
    g.add_argument("--lora-r", type=int, default=16)
    g.add_argument("--lora-alpha", type=int, default=32)
    g.add_argument("--lora-dropout", type=float, default=0.05)
    g.add_argument("--load-in-4bit", action="store_true",
                   help="QLoRA: load the base model in 4-bit NF4 with bitsandbytes (CUDA only; implies --use-lora)")
    g.add_argument("--use-vllm", action="store_true", help="generate with vLLM (CUDA only; pip install vllm)")
    g.add_argument("--vllm-mode", choices=["colocate", "server"], default="colocate",
                   help="colocate: vLLM inside each training process; server: a separate `trl vllm-serve` process "
                        "(default: %(default)s)")
    g.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3,
                   help="colocate: share of GPU memory vLLM may take (default: %(default)s)")
    g.add_argument("--vllm-server-base-url", default=None,
                   help="server mode: URL of `trl vllm-serve` (default: TRL's, http://0.0.0.0:8000)")
    g.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"], default="auto",
                   help="auto: bf16 where the GPU supports it, else fp16 on GPU, fp32 on CPU")
    g.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto",
                   help="dtype the weights are loaded in. auto: bfloat16 for a frozen LoRA base under bf16, else "
                        "float32 master weights (with DeepSpeed, which keeps its own fp32 copy, bfloat16 saves memory)")
    g.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                   help="recompute activations in the backward pass to save memory (default: TRL's, on)")
    g.add_argument("--use-cpu", action="store_true", help="train on CPU even if a GPU is present (tests, debugging)")

    g = parser.add_argument_group("logging")
    g.add_argument("--logging-steps", type=int, default=1)
    g.add_argument("--save-steps", type=int, default=100)
    g.add_argument("--report-to", default="none", help="none, wandb, tensorboard, trackio...")
    g.add_argument("--log-completions", action="store_true", help="print sample completions at each logging step")
    g.add_argument("--seed", type=int, default=42)


def finalize_args(args: argparse.Namespace, defaults: dict[str, Any]) -> argparse.Namespace:
    """Fill the defaults that depend on other options (LoRA learning rate, PPO group size...)."""
    if args.load_in_4bit:
        args.use_lora = True
    if args.learning_rate is None:
        args.learning_rate = defaults["lr_lora"] if args.use_lora else defaults["lr_full"]
    if args.num_generations is None:
        args.num_generations = 1 if args.algo == "ppo" else defaults["num_generations"]
    if args.per_device_train_batch_size is None:
        args.per_device_train_batch_size = max(2, args.num_generations) * (2 if args.algo == "grpo" else 8)
    if args.kl_estimator is None:
        args.kl_estimator = "k1" if args.algo == "ppo" else "k3"
    if args.algo == "grpo" and args.num_generations < 2:
        raise RecipeError("GRPO needs --num-generations >= 2 (a group to compare against); use --algo ppo for one")
    return args


# --------------------------------------------------------------------------------------------------------------
# Hardware and optional packages: checked before anything is built
# --------------------------------------------------------------------------------------------------------------


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check_requirements(args: argparse.Namespace) -> None:
    """Refuse, with the fix, options this machine cannot run: QLoRA and vLLM need CUDA and their packages."""
    import torch

    cuda = torch.cuda.is_available() and not args.use_cpu
    if args.load_in_4bit:
        if not cuda:
            raise RecipeError(
                "--load-in-4bit (QLoRA) needs a CUDA GPU: bitsandbytes 4-bit kernels do not run on CPU"
                + (" (--use-cpu was given)" if args.use_cpu else " and torch.cuda.is_available() is False")
                + ". Drop --load-in-4bit (use --use-lora alone) or run on a GPU machine."
            )
        if not _has_module("bitsandbytes"):
            raise RecipeError(
                "--load-in-4bit needs the bitsandbytes package: pip install 'trl-agentic[quantization]' "
                "(or pip install bitsandbytes)."
            )
    if args.use_vllm:
        if not _has_module("vllm"):
            raise RecipeError(
                "--use-vllm needs the vllm package: pip install 'trl-agentic[vllm]' (or pip install vllm), on a "
                "machine with a CUDA GPU. Without --use-vllm the recipe generates with transformers."
            )
        if not cuda:
            raise RecipeError("--use-vllm needs a CUDA GPU (torch.cuda.is_available() is False); drop --use-vllm.")


def precision_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``bf16``/``fp16``/``use_cpu`` for the config and the dtype to load the weights in."""
    import torch

    cuda = torch.cuda.is_available() and not args.use_cpu
    precision = args.precision
    if precision == "auto":
        # bf16 natively from Ampere (compute capability 8) on; a T4 (7.5) would only emulate it: fp16 there.
        precision = ("bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp16") if cuda else "fp32"
    if precision in ("bf16", "fp16") and not cuda:
        raise RecipeError(f"--precision {precision} needs a CUDA GPU; use --precision fp32 on CPU")
    dtype = args.dtype
    if dtype == "auto":
        # Mixed precision keeps fp32 weights: full fine-tuning at lr 1e-6 would lose its updates to bf16 rounding.
        # With LoRA the base weights are frozen, so they can be stored in bf16 (the adapters stay fp32).
        dtype = "bfloat16" if precision == "bf16" and args.use_lora else "float32"
    return {
        "config": {"bf16": precision == "bf16", "fp16": precision == "fp16", "use_cpu": not cuda},
        "dtype": dtype,
        "compute_dtype": torch.bfloat16 if precision == "bf16" else torch.float16,
    }


def model_settings(args: argparse.Namespace, precision: dict[str, Any]) -> dict[str, Any]:
    """``model_init_kwargs`` for the config and the trainer's ``peft_config`` / ``quantization_config``."""
    model_init_kwargs: dict[str, Any] = {"dtype": precision["dtype"]}
    peft_config = quantization_config = None
    if args.use_lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
    if args.load_in_4bit:
        from accelerate import PartialState
        from transformers import BitsAndBytesConfig

        quantization_config = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=precision["compute_dtype"],
        )
        model_init_kwargs["device_map"] = {"": PartialState().local_process_index}
        model_init_kwargs["dtype"] = "bfloat16" if precision["config"]["bf16"] else "float16"
    return {"model_init_kwargs": model_init_kwargs, "peft_config": peft_config,
            "quantization_config": quantization_config}


def trainer_classes(algo: str) -> tuple[type, type]:
    if algo == "ppo":
        from trl_agentic import AgenticPPOConfig, AgenticPPOTrainer

        return AgenticPPOTrainer, AgenticPPOConfig
    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer

    return AgenticGRPOTrainer, AgenticGRPOConfig


def build_config(args: argparse.Namespace, precision: dict[str, Any], model: dict[str, Any], **overrides: Any) -> Any:
    """The ``AgenticGRPOConfig`` (or ``AgenticPPOConfig``) from the options; ``overrides`` are recipe specifics."""
    _, config_cls = trainer_classes(args.algo)
    kwargs: dict[str, Any] = dict(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=0.05,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        temperature=args.temperature,
        kl_estimator=args.kl_estimator,
        max_turns=args.max_turns,
        max_tokens_per_turn=args.max_tokens_per_turn,
        max_completion_length=args.max_completion_length,
        max_observation_tokens=args.max_observation_tokens,
        env_timeout=args.env_timeout,
        rollout_mode=args.rollout_mode,
        mask_truncated_trajectories=args.mask_truncated_trajectories,
        trajectory_dir=args.trajectory_dir,
        model_init_kwargs=model["model_init_kwargs"],
        logging_steps=args.logging_steps,
        save_steps=args.save_steps,
        report_to=args.report_to,
        log_completions=args.log_completions,
        seed=args.seed,
        **precision["config"],
    )
    if args.gradient_checkpointing is not None:
        kwargs["gradient_checkpointing"] = args.gradient_checkpointing
    if args.loss_type:
        kwargs["loss_type"] = args.loss_type
    if args.algo == "ppo":
        kwargs["beta"] = args.beta
        kwargs["critic"] = args.critic
        kwargs["critic_learning_rate"] = args.critic_learning_rate or 10 * args.learning_rate
    else:
        kwargs["beta"] = args.beta
    if args.use_vllm:
        kwargs.update(use_vllm=True, vllm_mode=args.vllm_mode)
        if args.vllm_mode == "colocate":
            kwargs["vllm_gpu_memory_utilization"] = args.vllm_gpu_memory_utilization
        elif args.vllm_server_base_url:
            kwargs["vllm_server_base_url"] = args.vllm_server_base_url
    kwargs.update(overrides)
    return config_cls(**kwargs)


def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def has_chat_template(tokenizer: Any) -> bool:
    return getattr(tokenizer, "chat_template", None) is not None


# --------------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise RecipeError(f"{path}:{number}: not valid JSON ({exc})") from None
    return rows


def _load_file(path: Path) -> Any:
    from datasets import Dataset, load_dataset

    suffix = path.suffix.lower()
    if suffix == ".jsonl" or (suffix == ".json" and path.read_text(encoding="utf-8").lstrip()[:1] == "{"):
        return Dataset.from_list(_read_jsonl(path))
    kinds = {".json": "json", ".parquet": "parquet", ".csv": "csv"}
    if suffix not in kinds:
        raise RecipeError(f"--dataset-path {path}: unsupported file type {suffix!r} (use .jsonl, .json, .parquet, .csv)")
    return load_dataset(kinds[suffix], data_files=str(path), split="train")


def load_rows(dataset_path: str | None, hub_name: str, hub_config: str | None, split: str) -> Any:
    """A ``datasets.Dataset``: ``hub_name`` from the hub when ``dataset_path`` is None, else the local data."""
    if dataset_path is None:
        from datasets import load_dataset

        try:
            return load_dataset(hub_name, hub_config, split=split)
        except Exception as exc:
            raise RecipeError(
                f"could not load {hub_name}{f' ({hub_config})' if hub_config else ''} split {split!r} from the hub: "
                f"{type(exc).__name__}: {exc}. Offline? Pass --dataset-path with a local copy."
            ) from exc
    path = Path(dataset_path).expanduser()
    if path.is_file():
        return _load_file(path)
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
            from datasets import DatasetDict, load_from_disk

            data = load_from_disk(str(path))
            if isinstance(data, DatasetDict):
                if split not in data:
                    raise RecipeError(f"{path} has splits {list(data)}, not {split!r} (--dataset-split)")
                data = data[split]
            return data
        for suffix in (".jsonl", ".json", ".parquet"):
            candidate = path / f"{split}{suffix}"
            if candidate.exists():
                return _load_file(candidate)
        raise RecipeError(f"{path} holds no {split}.jsonl, {split}.json or {split}.parquet (--dataset-split {split})")
    raise RecipeError(f"--dataset-path {path} does not exist")


def take(dataset: Any, n: int | None) -> Any:
    return dataset if n is None else dataset.select(range(min(n, len(dataset))))


def require_columns(dataset: Any, columns: Sequence[str], where: str) -> None:
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise RecipeError(f"{where}: the data lacks the column(s) {missing}; it has {dataset.column_names}")


# --------------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------------


def close_at_end(resource: Any) -> Any:
    """A trainer callback that calls ``resource.close()`` when training ends (the sandbox's worker pool)."""
    from transformers import TrainerCallback

    class CloseAtEnd(TrainerCallback):
        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            close = getattr(resource, "close", None)
            if callable(close):
                close()

    return CloseAtEnd()


def set_offline_friendly_env() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def run_main(build_trainer: Any, parse_args: Any, argv: Sequence[str] | None) -> int:
    """Parse, build, train, save. A :class:`RecipeError` is printed (no traceback) and exits with status 2."""
    import sys

    try:
        args = parse_args(argv)
        trainer = build_trainer(args)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    trainer.train()
    trainer.save_model(args.output_dir)
    if trainer.accelerator.is_main_process:
        print(f"saved to {args.output_dir}")
    return 0
