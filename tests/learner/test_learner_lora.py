"""LoRA (peft) on the plain torch learner: only the adapters train, the reference is the base model with
adapters disabled (no copy), the loss equals one built by hand from a peft model's full logits, merged
weights and exports are plain HF models. (LoRA on DeepSpeed ZeRO-3 against this learner:
tests/learner/test_learner_deepspeed.py, case z3_lora.)"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from test_learner import _batch, _hand_grpo_loss, _model

from swerl.learner import AlgoConfig, KLConfig, Learner, LearnerConfig, LoRAConfig, OptimConfig, make_learner
from swerl.learner import sequence_stats as seq_stats
from swerl.learner.lora import AdapterDisabledReference, causal_lm

LORA = LoRAConfig(enabled=True, r=4, alpha=8.0, target_modules=("q_proj", "v_proj", "up_proj", "down_proj"))
KL_COEF = 0.5


def _randomise_adapters(model) -> None:
    """Non-zero B matrices (peft starts them at 0, where the adapted model is the base model)."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def _hand_peft(base):
    """The same adapters through peft's own API (apply_lora draws lora_A under seed 0)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(r=LORA.r, lora_alpha=LORA.alpha, lora_dropout=0.0, bias="none",
                                            target_modules=list(LORA.target_modules), task_type="CAUSAL_LM"))
    _randomise_adapters(model)
    return model


def _hand_kl(model, batch) -> tuple[float, float]:
    """Token-mean k3 KL between the adapted model and its base (adapters disabled), from full logits,
    and how far the learner's may be from it: the learner keeps the reference log-probs as fp32, each
    off by ≤ 2⁻²⁴·|ref|, and k3(d) = e⁻ᵈ + d − 1 has slope 1 − e⁻ᵈ, so the mean moves by at most
    2⁻²⁴·max|ref·(1 − e⁻ᵈ)| (+ slack for the slope's change over that step and fp64 rounding)."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
                                 .logits[:, :-1].double(), -1)
        with model.disable_adapter():
            ref = torch.log_softmax(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
                                    .logits[:, :-1].double(), -1)
    tgt = batch.input_ids[:, 1:, None]
    ref_y = ref.gather(-1, tgt).squeeze(-1)
    d = logp.gather(-1, tgt).squeeze(-1) - ref_y
    k3 = torch.exp(-d) + d - 1
    mask = batch.loss_mask[:, 1:].bool()
    err = 2**-24 * float((ref_y * (1 - torch.exp(-d))).abs()[mask].max())
    return float(k3[mask].mean()), 1.01 * err + 1e-12


def _lora_learner(lr: float = 1e-2, dtype: torch.dtype = torch.float32) -> Learner:
    learner = make_learner(_model(seed=5, dtype=dtype), AlgoConfig(kl=KLConfig(coef=KL_COEF)),
                           OptimConfig(lr=lr), LearnerConfig(lora=LORA))
    assert isinstance(learner, Learner) and learner.lora
    _randomise_adapters(learner.policy)
    return learner


def test_first_update_has_the_hand_built_peft_loss_and_trains_only_the_adapters():
    # fp64 models (learner and hand-built), so that fp32 kernels' vendor-dependent rounding is out of
    # the comparison; what is left is fp64 summation order (~1e-16) and the fp32 reference log-probs
    batch = _batch(seed=8)
    hand = _hand_peft(_model(seed=5, dtype=torch.float64))
    expected_pg = _hand_grpo_loss(hand, batch)
    expected_kl, kl_err = _hand_kl(hand, batch)
    assert expected_kl > 1e-3  # the reference really is the base model, not the adapted policy

    learner = _lora_learner(dtype=torch.float64)
    adapters = {n for n, p in learner.policy.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    assert sum(len(g["params"]) for g in learner.optimizer.param_groups) == len(adapters)
    # the reference is a view of the policy with adapters disabled, not a second copy of the weights
    assert (isinstance(learner.reference, AdapterDisabledReference)
            and learner.reference.policy is learner.policy)
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}

    m = learner.update(batch)
    assert m.pg_loss == pytest.approx(expected_pg, abs=1e-10)
    assert kl_err < 1e-3 * expected_kl and m.kl == pytest.approx(expected_kl, abs=kl_err)
    assert m.loss == pytest.approx(expected_pg + KL_COEF * expected_kl, abs=KL_COEF * kl_err + 1e-10)
    for n, p in learner.policy.named_parameters():
        if n in adapters:
            assert not torch.equal(p, before[n]), f"adapter {n} did not move"
        else:
            assert torch.equal(p, before[n]), f"frozen {n} changed"


def test_merged_weights_are_plain_hf_and_the_export_reproduces_the_policy(tmp_path):
    from transformers import AutoModelForCausalLM

    # fp64: W + s·B·A by the learner and by peft are sums in possibly different orders
    learner = _lora_learner(dtype=torch.float64)
    batch = _batch(seed=9)
    learner.update(batch)
    merged = learner.policy_state_dict()
    plain_keys = list(_model().state_dict())
    assert list(merged) == plain_keys  # the names a rollout engine of the base model loads
    expected = copy.deepcopy(learner.policy).merge_and_unload().state_dict()  # peft's own merge
    for k in plain_keys:
        assert merged[k].dtype == torch.float64
        torch.testing.assert_close(merged[k], expected[k], atol=1e-12, rtol=1e-12, msg=k)

    out = learner.export_hf(tmp_path / "policy")
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
    assert type(loaded).__name__ == "Qwen2ForCausalLM" and not (out / "adapter_config.json").exists()
    with torch.no_grad():
        want = seq_stats(causal_lm(learner.policy), batch, chunk_size=64).logp
        got = seq_stats(loaded, batch, chunk_size=64).logp
    real = batch.attention_mask[:, 1:].bool()
    # merged weights vs W·x + s·B·(A·x): the same sums regrouped, ~1e-15 in fp64
    torch.testing.assert_close(got[real], want[real], atol=1e-10, rtol=1e-10)
    # and it is not the base model: the adapters changed the log-probs
    with torch.no_grad(), learner.policy.disable_adapter():
        base = seq_stats(causal_lm(learner.policy), batch, chunk_size=64).logp
    assert (base[real] - want[real]).abs().max() > 1e-3


def test_lora_checkpoint_roundtrip_gives_the_same_next_update(tmp_path):
    b1, b2 = _batch(seed=1), _batch(seed=2)
    a = _lora_learner()
    a.update(b1)
    path = a.save_checkpoint(tmp_path, a.step, {"train_step": 1})
    ma = a.update(b2)
    b = _lora_learner()  # same base and initial adapters: the reference is the same base model
    assert b.load_checkpoint(path) == {"train_step": 1} and b.step == 1
    mb = b.update(b2)
    assert (ma.loss, ma.grad_norm, ma.kl) == (mb.loss, mb.grad_norm, mb.kl)
    for (n, x), y in zip(a.policy.named_parameters(), b.policy.parameters(), strict=True):
        assert torch.equal(x, y), n


def test_make_learner_picks_the_plain_learner_without_lora():
    learner = make_learner(_model(), AlgoConfig(), OptimConfig(), LearnerConfig())
    assert type(learner) is Learner and learner.reference is None


def test_lora_config_rejects_bad_values():
    with pytest.raises(ValueError, match=re.escape("lora.r must be >= 1")):
        LoRAConfig(r=0)
    with pytest.raises(ValueError, match=re.escape("lora.dropout")):
        LoRAConfig(dropout=1.0)
    with pytest.raises(ValueError, match="target_modules is empty"):
        LoRAConfig(target_modules=())
    with pytest.raises(ValueError, match="embed_tokens"):
        LoRAConfig(target_modules=("embed_tokens",))
    with pytest.raises(TypeError, match="apply_lora"):
        AdapterDisabledReference(_model())
