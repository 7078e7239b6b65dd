import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.testing import assert_close
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from trl_agentic.algorithms.losses import clipped_value_loss
from trl_agentic.trainers.critic import SharedValueHead, ValueModel, _apply_head

hf_logging.set_verbosity_error()

LORA_TARGETS = ["q_proj", "v_proj"]


def tiny_config() -> Qwen2Config:
    return Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )


@pytest.fixture(scope="module")
def policy_path(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("policy")
    Qwen2ForCausalLM(tiny_config()).save_pretrained(path)
    return str(path)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 128, (3, 12), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # left-padded prompt
    attention_mask[2, -3:] = 0  # right-padded completion
    return input_ids, attention_mask


def completion_mask(attention_mask: torch.Tensor, n: int) -> torch.Tensor:
    mask = attention_mask[:, -n:].clone()
    mask[1, 2:4] = 0  # an observation
    return mask


def lora(r: int = 4) -> LoraConfig:
    return LoraConfig(r=r, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.0)


def perturb_lora(model, adapter: str) -> None:
    """LoRA B starts at zero (a no-op adapter); make it do something."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if f"lora_B.{adapter}." in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


def perturb_head(head) -> None:
    """A fresh value head is zero (a constant critic, V = 0); make it depend on the hidden states."""
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g))
        head.bias.fill_(0.3)


def value_loss(values, mask):
    returns = torch.linspace(-1, 1, values.numel()).view_as(values)
    loss, _ = clipped_value_loss(values, values.detach() + 0.01, returns, mask, 0.2)
    return loss


def test_value_model_shapes_dtype_and_alignment(policy_path, batch):
    input_ids, attention_mask = batch
    critic = ValueModel.from_policy(policy_path)
    perturb_head(critic.head)
    full = critic(input_ids, attention_mask)
    assert full.shape == (3, 12) and full.dtype == torch.float32
    completion = critic(input_ids, attention_mask, completion_length=5)
    assert completion.shape == (3, 5)
    assert_close(completion, full[:, -6:-1])  # value of token i read from the hidden state before it


def test_value_model_from_instance_equals_from_path(policy_path, batch):
    input_ids, attention_mask = batch
    policy = Qwen2ForCausalLM.from_pretrained(policy_path)
    from_path = ValueModel.from_policy(policy_path)
    from_copy = ValueModel.from_policy(policy)
    perturb_head(from_path.head)
    from_copy.head.load_state_dict(from_path.head.state_dict())
    assert_close(from_copy(input_ids, attention_mask), from_path(input_ids, attention_mask))
    # a deep copy: training the critic leaves the policy alone
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(from_copy.parameters(), policy.parameters(), strict=False))


def test_value_model_from_peft_policy_starts_from_merged_weights(policy_path, batch):
    input_ids, attention_mask = batch
    policy = get_peft_model(Qwen2ForCausalLM.from_pretrained(policy_path), lora())
    perturb_lora(policy, "default")
    critic = ValueModel.from_policy(policy)
    perturb_head(critic.head)
    hidden = policy(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states[-1]
    assert_close(critic(input_ids, attention_mask), critic.head(hidden).squeeze(-1))
    assert not any("lora" in name for name, _ in critic.named_parameters())
    assert all(p.requires_grad for p in critic.parameters())  # the merged base came frozen from PEFT


def test_value_model_gradients_reach_head_and_backbone_and_not_masked_values(policy_path, batch):
    input_ids, attention_mask = batch
    critic = ValueModel.from_policy(policy_path)
    perturb_head(critic.head)
    values = critic(input_ids, attention_mask, completion_length=6)
    values.retain_grad()
    mask = completion_mask(attention_mask, 6)
    value_loss(values, mask).backward()
    assert torch.all(values.grad[mask == 0] == 0)
    assert torch.any(values.grad[mask == 1] != 0)
    assert critic.head.weight.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.backbone.layers[0].parameters())


def test_value_model_with_lora_trains_adapter_and_head_only(policy_path, batch):
    input_ids, attention_mask = batch
    critic = ValueModel.from_policy(policy_path, peft_config=lora())
    perturb_head(critic.head)
    mask = completion_mask(attention_mask, 6)
    value_loss(critic(input_ids, attention_mask, completion_length=6), mask).backward()
    lora_params = {n: p for n, p in critic.named_parameters() if "lora_" in n}
    assert lora_params and all(p.requires_grad for p in lora_params.values())
    assert any(p.grad.abs().sum() > 0 for n, p in lora_params.items() if "lora_B" in n)
    assert critic.head.weight.grad.abs().sum() > 0
    frozen = [p for n, p in critic.backbone.named_parameters() if "lora_" not in n]
    assert frozen and all(not p.requires_grad and p.grad is None for p in frozen)


@pytest.mark.parametrize("use_lora", [False, True])
def test_value_model_save_load_round_trip(policy_path, batch, tmp_path, use_lora):
    input_ids, attention_mask = batch
    critic = ValueModel.from_policy(policy_path, peft_config=lora() if use_lora else None)
    perturb_head(critic.head)
    if use_lora:
        perturb_lora(critic, "default")
    else:
        with torch.no_grad():
            critic.backbone.layers[0].self_attn.q_proj.weight.add_(0.1)  # differs from the policy checkpoint
    critic.save_pretrained(tmp_path)
    loaded = ValueModel.from_pretrained(tmp_path)
    assert_close(loaded(input_ids, attention_mask), critic(input_ids, attention_mask))
    if use_lora:
        assert any(p.requires_grad for n, p in loaded.named_parameters() if "lora_" in n)


def test_shared_head_only_is_the_head_over_the_policys_hidden_states(policy_path, batch):
    input_ids, attention_mask = batch
    policy = Qwen2ForCausalLM.from_pretrained(policy_path)
    shared = SharedValueHead(policy)
    perturb_head(shared.head)
    assert [n for n, _ in shared.named_parameters()] == ["head.weight", "head.bias"]
    out = policy(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    from_hidden = _apply_head(shared.head, out.hidden_states[-1], completion_length=5)
    assert from_hidden.shape == (3, 5) and from_hidden.dtype == torch.float32
    assert_close(from_hidden, shared(input_ids, attention_mask, completion_length=5))
    # shared actor-critic: the value loss trains the policy's weights too
    mask = completion_mask(attention_mask, 5)
    value_loss(from_hidden, mask).backward()
    assert policy.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert shared.head.weight.grad.abs().sum() > 0


def peft_policy(policy_path):
    torch.manual_seed(0)  # LoRA A is drawn from the global generator
    policy = get_peft_model(Qwen2ForCausalLM.from_pretrained(policy_path), lora())
    perturb_lora(policy, "default")
    return policy


def lora_grads(model, adapter):
    return {n: p.grad.clone() for n, p in model.named_parameters() if f".{adapter}." in n and p.grad is not None}


def test_shared_critic_adapter_runs_its_own_adapter_and_restores_the_policy(policy_path, batch):
    input_ids, attention_mask = batch
    policy = peft_policy(policy_path)
    logits_before = policy(input_ids=input_ids, attention_mask=attention_mask).logits
    shared = SharedValueHead(policy, adapter_config=lora(r=2))
    perturb_lora(policy, "critic")
    perturb_head(shared.head)
    flags = {n: p.requires_grad for n, p in policy.named_parameters()}
    assert all(flags[n] for n in flags if "lora_" in n)  # both adapters trainable at rest
    values = shared(input_ids, attention_mask, completion_length=5)
    assert policy.active_adapter == "default"
    assert flags == {n: p.requires_grad for n, p in policy.named_parameters()}
    assert_close(policy(input_ids=input_ids, attention_mask=attention_mask).logits, logits_before)
    # the values are those of the critic adapter, not of the policy's hidden states
    policy_hidden = policy(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
    assert not torch.allclose(values, _apply_head(shared.head, policy_hidden[-1], 5))
    policy.set_adapter("critic")
    critic_hidden = policy.get_base_model().model(input_ids=input_ids, attention_mask=attention_mask)
    policy.set_adapter("default")
    assert_close(values, _apply_head(shared.head, critic_hidden.last_hidden_state, 5))
    names = {id(p) for p in shared.critic_parameters()}
    assert {id(shared.head.weight), id(shared.head.bias)} <= names
    assert all(id(p) in names for n, p in policy.named_parameters() if ".critic." in n)
    assert not any(id(p) in names for n, p in policy.named_parameters() if ".default." in n)


def test_shared_critic_adapter_one_backward_gives_each_adapter_its_own_gradient(policy_path, batch):
    input_ids, attention_mask = batch
    policy = peft_policy(policy_path)
    shared = SharedValueHead(policy, adapter_config=lora(r=2))
    perturb_lora(policy, "critic")
    perturb_head(shared.head)
    mask = completion_mask(attention_mask, 5)

    def policy_loss():
        logits = policy(input_ids=input_ids, attention_mask=attention_mask).logits[:, -6:-1]
        return (logits.log_softmax(-1)[..., 0] * mask).sum()

    def critic_loss():
        return value_loss(shared(input_ids, attention_mask, completion_length=5), mask)

    policy_loss().backward()
    policy_only = lora_grads(policy, "default")
    assert policy_only and not lora_grads(policy, "critic")
    policy.zero_grad()
    critic_loss().backward()
    critic_only = lora_grads(policy, "critic")
    assert critic_only and not lora_grads(policy, "default")
    policy.zero_grad()
    shared.zero_grad()
    (policy_loss() + critic_loss()).backward()
    for name, grad in {**policy_only, **critic_only}.items():
        assert_close(dict(policy.named_parameters())[name].grad, grad)
    assert shared.head.weight.grad.abs().sum() > 0
    assert all(p.grad is None for n, p in policy.named_parameters() if "lora_" not in n)


@pytest.mark.parametrize("reentrant", [False, True])
def test_shared_critic_adapter_under_gradient_checkpointing_gets_the_same_gradients(policy_path, batch, reentrant):
    input_ids, attention_mask = batch
    mask = completion_mask(attention_mask, 5)
    grads = {}
    for checkpointing in (False, True):
        policy = peft_policy(policy_path).train()  # checkpointing only runs in training mode
        torch.manual_seed(3)
        shared = SharedValueHead(policy, adapter_config=lora(r=2))
        perturb_lora(policy, "critic")
        perturb_head(shared.head)
        if checkpointing:
            policy.get_base_model().activation_checkpointing_enable({"use_reentrant": reentrant})
            policy.enable_input_require_grads()  # as TRL does for PEFT + checkpointing
        logits = policy(input_ids=input_ids, attention_mask=attention_mask).logits[:, -6:-1]
        values = shared(input_ids, attention_mask, completion_length=5)
        ((logits.log_softmax(-1)[..., 0] * mask).sum() + value_loss(values, mask)).backward()
        grads[checkpointing] = {**lora_grads(policy, "default"), **lora_grads(policy, "critic")}
        grads[checkpointing]["head"] = shared.head.weight.grad
        if checkpointing:
            assert policy.get_base_model().is_activation_checkpointing  # restored after the critic pass
    assert grads[True].keys() == grads[False].keys() and len(grads[True]) > 1
    for name, grad in grads[False].items():
        assert_close(grads[True][name], grad, msg=name)


def test_critic_adapter_needs_a_peft_policy(policy_path):
    with pytest.raises(TypeError, match="PEFT"):
        SharedValueHead(Qwen2ForCausalLM.from_pretrained(policy_path), adapter_config=lora())


@pytest.mark.parametrize("with_adapter", [False, True])
def test_shared_save_load_round_trip(policy_path, batch, tmp_path, with_adapter):
    input_ids, attention_mask = batch
    policy = peft_policy(policy_path)
    shared = SharedValueHead(policy, adapter_config=lora(r=2) if with_adapter else None)
    perturb_head(shared.head)
    if with_adapter:
        perturb_lora(policy, "critic")
    shared.save_pretrained(tmp_path)
    fresh_policy = get_peft_model(Qwen2ForCausalLM.from_pretrained(policy_path), lora())
    fresh_policy.load_state_dict({n: p for n, p in policy.state_dict().items() if ".critic." not in n}, strict=False)
    loaded = SharedValueHead.from_pretrained(fresh_policy, tmp_path)
    assert loaded.adapter_name == ("critic" if with_adapter else None)
    assert_close(loaded(input_ids, attention_mask), shared(input_ids, attention_mask))
    if with_adapter:
        assert all(p.requires_grad for n, p in fresh_policy.named_parameters() if ".critic." in n)
        assert fresh_policy.active_adapter == "default"


@pytest.mark.parametrize("layout", ["separate", "shared", "shared_adapter"])
def test_a_fresh_critic_predicts_zero_whatever_the_hidden_scale_and_learns_from_the_first_step(
    policy_path, batch, layout
):
    """An untrained critic is the constant baseline V = 0 (Gemma's hidden states have an RMS of 2 to 5, and a random
    head turned that into values of +-10); its head gets a gradient at once, the decoder from the second step."""
    input_ids, attention_mask = batch
    mask = completion_mask(attention_mask, 5)
    if layout == "separate":
        critic = ValueModel.from_policy(policy_path)
        with torch.no_grad():  # hidden states far from unit scale
            critic.backbone.norm.weight.mul_(50.0)
        trunk = list(critic.backbone.layers[0].parameters())
    else:
        policy = peft_policy(policy_path)
        critic = SharedValueHead(policy, adapter_config=lora(r=2) if layout == "shared_adapter" else None)
        adapter = "critic" if layout == "shared_adapter" else "default"
        trunk = [p for n, p in policy.named_parameters() if f"lora_B.{adapter}." in n]
    values = critic(input_ids, attention_mask, completion_length=5)
    assert torch.equal(values, torch.zeros_like(values))
    value_loss(values, mask).backward()
    assert critic.head.weight.grad.abs().sum() > 0
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in trunk)  # dL/dh = (V - R) w = 0 at w = 0
    torch.optim.SGD(critic.head.parameters(), lr=0.1).step()
    value_loss(critic(input_ids, attention_mask, completion_length=5), mask).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trunk)
