"""QLoRA on the CPU: bitsandbytes' CPU backend (0.46 and later) runs 4-bit NF4 weights, so a real 4-bit LoRA
training step of AgenticGRPOTrainer runs here. Skipped where bitsandbytes is not installed (the
``quantization`` extra)."""

import pytest
import torch
from helpers import agent_tokens_reward, agentic_args, lookup_dataset
from peft import LoraConfig

from trl_agentic import AgenticGRPOTrainer
from trl_agentic.toy import LookupEnvironment, lookup_reward


def test_a_4bit_lora_step_trains_the_adapter_and_keeps_the_base_4bit(tiny_model_dir, tokenizer, tmp_path):
    bnb = pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, quantization_config=quantization, device_map="cpu")
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = AgenticGRPOTrainer(model=model, reward_funcs=[lookup_reward, agent_tokens_reward], args=agentic_args(tmp_path, max_steps=1),
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=LookupEnvironment, peft_config=lora)
    base = trainer.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer
    assert isinstance(base, bnb.nn.Linear4bit) and base.weight.dtype == torch.uint8
    packed = base.weight.detach().clone()
    adapter = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapter and all("lora_" in n for n in adapter)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(adapter[n], after[n].detach()) for n in adapter)
    assert torch.equal(packed, base.weight.detach())  # the 4-bit base is frozen
    assert trainer.state.log_history[0]["agentic/mask_audit"] == 0
