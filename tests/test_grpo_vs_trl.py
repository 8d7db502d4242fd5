"""Differential tests: our GRPO and DPO losses and gradients against TRL's own code on identical inputs."""
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from replication.lm import dpo, grpo

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")


class _Accelerator:
    """Single-process stand-in for accelerate's gather/reduce used in TRL's metric logging."""

    device = torch.device("cpu")
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def _inputs(seed=0, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(B, T, generator=g) * 3).double()
    old = logps + 0.4 * torch.randn(B, T, generator=g).double()  # ratios well outside [0.8, 1.2]: clipping active
    ref = logps + 0.3 * torch.randn(B, T, generator=g).double()
    adv = torch.randn(B, generator=g).double()
    mask = torch.ones(B, T, dtype=torch.long)
    for i, n in enumerate([7, 3, 5, 1, 6, 4][:B]):
        mask[i, n:] = 0
    return logps, old, ref, adv, mask


def _trl_grpo_loss(logps, old, ref, adv, mask, loss_type, beta, eps_low, eps_high, T):
    leaf = logps.clone().requires_grad_(True)
    stub = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=True, delta=None), loss_type=loss_type, epsilon_low=eps_low,
        epsilon_high=eps_high, use_vllm=False, vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, max_completion_length=T,
        _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics={"train": defaultdict(list)},
        accelerator=_Accelerator(),
        _get_per_token_logps_and_entropies=lambda *a, **k: (leaf, torch.zeros_like(leaf), None),
    )
    inputs = {"prompt_ids": torch.zeros(len(adv), 2, dtype=torch.long), "prompt_mask": torch.ones(len(adv), 2),
              "completion_ids": torch.zeros_like(mask), "completion_mask": mask, "advantages": adv,
              "old_per_token_logps": old, "ref_per_token_logps": ref}
    loss = trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)
    loss.backward()
    return loss.detach(), leaf.grad, stub._metrics["train"]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_loss_and_gradient_match_trl(loss_type, seed):
    logps, old, ref, adv, mask = _inputs(seed)
    beta, lo, hi, T = 0.04, 0.2, 0.28, logps.shape[1]
    want, want_grad, metrics = _trl_grpo_loss(logps, old, ref, adv, mask, loss_type, beta, lo, hi, T)
    leaf = logps.clone().requires_grad_(True)
    got, stats = grpo.grpo_loss(leaf, old, ref, adv, mask, beta, lo, hi, loss_type, max_completion_length=T,
                                kl_ratio_correction=True)
    got.backward()
    assert metrics["clip_ratio/region_mean"][0] > 0.05, "the test must exercise clipping"
    assert torch.allclose(got.detach(), want, atol=1e-6, rtol=0)
    assert torch.allclose(leaf.grad, want_grad, atol=1e-6, rtol=0)
    assert stats["kl"] == pytest.approx(metrics["kl"][0], abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(metrics["clip_ratio/region_mean"][0], abs=1e-6)


def test_kl_ratio_correction_changes_the_gradient_on_policy():
    logps, _, ref, adv, mask = _inputs(3)
    grads = []
    for corr in (True, False):
        leaf = logps.clone().requires_grad_(True)
        loss, _ = grpo.grpo_loss(leaf, logps, ref, adv, mask, 0.04, 0.2, 0.2, "grpo", kl_ratio_correction=corr)
        loss.backward()
        grads.append(leaf.grad)
    assert not torch.allclose(*grads)


def test_group_advantages_match_trl_convention():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.5, 0.9, 0.1])
    adv, zero = grpo.group_advantages(rewards, 4)
    r = rewards.view(-1, 4)
    std = trl_grpo.nanstd(r, dim=1).repeat_interleave(4)
    want = (rewards - r.mean(1).repeat_interleave(4)) / (std + 1e-4)
    assert torch.allclose(adv, want, atol=1e-6)
    assert zero.tolist() == [False] * 4 + [True] * 4 + [False] * 4 and torch.all(adv[4:8] == 0)
    flat, _ = grpo.group_advantages(rewards, 4, scale=False)
    assert torch.allclose(flat, rewards - r.mean(1).repeat_interleave(4))


def _trl_dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """Run TRL's DPOTrainer._compute_loss on a fake model output whose per-token log-probs we set."""
    B = len(chosen)
    per_token = torch.stack([torch.cat([chosen, rejected]), torch.zeros(2 * B, dtype=chosen.dtype)], 1)
    leaf = per_token.clone().requires_grad_(True)
    out = SimpleNamespace(log_probs=leaf, entropy=torch.zeros_like(leaf), mean_logits=torch.zeros_like(leaf),
                          is_top1=torch.zeros_like(leaf, dtype=torch.bool), aux_loss=None)
    model = lambda **kw: out  # noqa: E731
    stub = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_Accelerator(), aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=["sigmoid"], loss_weights=[1.0],
        beta=beta, use_weighting=False, _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
        args=SimpleNamespace(), label_smoothing=0.0,
    )
    inputs = {"input_ids": torch.zeros(2 * B, 3, dtype=torch.long), "attention_mask": torch.ones(2 * B, 3),
              "completion_mask": torch.tensor([[0, 1, 1]] * (2 * B)), "ref_chosen_logps": ref_chosen,
              "ref_rejected_logps": ref_rejected}
    loss = trl_dpo.DPOTrainer._compute_loss(stub, model, inputs, return_outputs=False)
    loss.backward()
    return loss.detach(), leaf.grad[:, 0]


def test_dpo_loss_matches_trl_sigmoid():
    g = torch.Generator().manual_seed(0)
    chosen, rejected, rc, rr = (-torch.rand(5, generator=g).double() * 20 for _ in range(4))
    want, want_grad = _trl_dpo_loss(chosen, rejected, rc, rr, beta=0.1)
    c, r = chosen.clone().requires_grad_(True), rejected.clone().requires_grad_(True)
    got, _ = dpo.dpo_loss(c, r, rc, rr, dpo_beta=0.1)
    got.backward()
    assert torch.allclose(got.detach(), want, atol=1e-6)
    assert torch.allclose(torch.cat([c.grad, r.grad]), want_grad, atol=1e-6)
