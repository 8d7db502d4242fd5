"""The GRPO trainer on a tiny model: it learns, it resumes exactly, and it rejects bad configs."""
import pytest
import torch

from replication.lm import dpo, grpo, loop, models, training

LETTERS = set("abcdefghijklmnopqrstuvwxyz")
PROMPTS = ["write", "say something", "go", "hello"]


def letter_reward(prompts, completions, metadata, **log):
    """Fraction of lower-case letters in the completion: a reward that favours a set of tokens."""
    return [sum(ch in LETTERS for ch in c) / max(len(c), 1) for c in completions]


def make_trainer(seed=0, **overrides):
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=8, alpha=16)
    settings = {"num_generations": 8, "max_new_tokens": 8, "lr": 2e-2, "kl_beta": 0.0, "save_every": 3, **overrides}
    cfg = grpo.GRPOConfig(seed=seed, **settings)
    return grpo.GRPOTrainer(model, tok, letter_reward, cfg)


def sampler(step):
    return PROMPTS, [{"step": step}] * len(PROMPTS)


def test_mean_reward_rises():
    trainer = make_trainer()
    rows = trainer.train(sampler, 40, progress=False)
    first, last = sum(r["reward_mean"] for r in rows[:5]) / 5, sum(r["reward_mean"] for r in rows[-5:]) / 5
    assert last > first + 0.4, (first, last)
    assert all(k in rows[0] for k in ("reward_std", "zero_std_frac", "kl", "clip_frac", "loss", "grad_norm",
                                      "completion_len", "tokens_per_s", "wall_s", "generation_s", "backward_s"))


def test_reinforce_pp_and_kl_and_iterations_run():
    trainer = make_trainer(advantage="reinforce++", kl_beta=0.04, num_iterations=2, grad_accum_steps=2,
                           loss_type="bnpo")
    rows = trainer.train(sampler, 2, progress=False)
    assert rows[-1]["kl"] >= 0 and rows[-1]["clip_frac"] >= 0


def test_resume_gives_identical_weights(tmp_path):
    straight = make_trainer()
    straight.train(sampler, 6, loop.RunFolder(tmp_path / "a"), progress=False)

    first = make_trainer()
    folder = loop.RunFolder(tmp_path / "b")
    first.train(sampler, 3, folder, progress=False)  # checkpoint at step 3 (and done marker for 3 steps)
    (folder.path / "done.json").unlink()              # as if interrupted after step 3
    second = make_trainer()
    second.train(sampler, 6, folder, progress=False)

    a, b = loop.trainable(straight.model), loop.trainable(second.model)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in folder.rows()] == list(range(6))
    assert [r["reward_mean"] for r in folder.rows()] == [r["reward_mean"] for r in loop.RunFolder(tmp_path / "a").rows()]


def test_finished_run_is_skipped(tmp_path):
    folder = loop.RunFolder.keyed(tmp_path, "letters", {"steps": 2})
    rows = make_trainer().train(sampler, 2, folder, progress=False)
    assert folder.done and make_trainer().train(sampler, 2, folder, progress=False) == rows


def assert_grouped_matches_plain(model, p_ids, p_mask, c_ids, c_mask, group_size):
    """The GRPO loss and LoRA gradient through grouped_logps equal the plain pass's (fp32, 1e-5), and are not zero."""
    adv = torch.randn(len(c_ids))

    def loss_and_grad(fn):
        model.zero_grad()
        logps = fn(model, p_ids, p_mask, c_ids, c_mask)
        loss, _ = grpo.grpo_loss(logps, logps.detach(), logps.detach() - 0.1, adv, c_mask, kl_beta=0.04)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in training.trainable(model).items()}

    plain = loss_and_grad(lambda *a: training.completion_logps(*a, temperature=0.7))
    shared = loss_and_grad(lambda *a: training.grouped_logps(*a, group_size=group_size, temperature=0.7))
    assert torch.allclose(plain[0], shared[0], atol=1e-5)
    assert all(torch.allclose(plain[1][k], shared[1][k], atol=1e-5) for k in plain[1])
    assert max(g.abs().max() for g in plain[1].values()) > 1e-3  # the gradient is not trivially zero


def test_a_shared_leading_run_is_encoded_once_with_the_plain_loss_and_gradient():
    """Prompts led by the same worked examples (chat turns) share their leading run: models.encode_prompts encodes it once,
    and grouped_logps still gives completion_logps' loss and LoRA gradient (fp32, 1e-5); prompts of different
    lengths, one of them the shortest, so the padding after the shared run is exercised."""
    torch.manual_seed(0)
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    for p in training.trainable(model).values():
        torch.nn.init.normal_(p, std=0.05)
    shots = [{"role": "user", "content": "What is 12 + 30? End with: The answer is N."},
             {"role": "assistant", "content": "12 + 30 = 42. The answer is 42."}]
    texts = models.chat_prompts(tok, [shots + [{"role": "user", "content": q}] for q in ("1 + 1?", "A longer one: 7 + 5?", "9?")])
    p_ids, p_mask, c_ids, c_mask = models.sample(model, tok, texts, 8, 1.0, repeats=3)
    c_mask[2, 2:] = 0
    assert models.common_prefix(p_ids[::3], p_mask[::3]) >= 32  # the shared path is the one tested
    assert_grouped_matches_plain(model, p_ids, p_mask, c_ids, c_mask, group_size=3)


def test_common_prefix_ignores_left_padding():
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [5, 6, 7, 9, 9, 9], [0, 5, 6, 7, 8, 1]])
    mask = (torch.arange(6)[None] >= torch.tensor([[2], [0], [1]])).long()
    assert models.common_prefix(ids, mask) == 3
    assert models.common_prefix(ids[[0, 2]], mask[[0, 2]]) == 4


@pytest.mark.parametrize("overrides, message", [
    ({"num_generations": 1}, "num_generations=1"),
    ({"kl_beta": -0.1}, "kl_beta=-0.1"),
    ({"epsilon_low": 0.0}, "epsilon_low=0.0"),
    ({"epsilon_high": 1.5}, "epsilon_high=1.5"),
    ({"loss_type": "ppo"}, "loss_type='ppo'"),
    ({"advantage": "gae"}, "advantage='gae'"),
    ({"max_new_tokens": 0}, "max_new_tokens=0"),
    ({"update_dtype": "float16"}, "update_dtype='float16'"),
])
def test_bad_configs_name_the_parameter(overrides, message):
    with pytest.raises(ValueError, match=message):
        grpo.GRPOConfig(**overrides).validate()


def test_reinforce_pp_whitens_per_group():
    rewards = torch.tensor([1.0, 0.0, 5.0, 3.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    adv = grpo.reinforce_pp_advantages(rewards, mask, groups=["solver", "solver", "judge", "judge"])
    for idx in ([0, 1], [2, 3]):
        m = mask[idx].bool()
        assert adv[idx][m].mean().abs() < 1e-5 and adv[idx][m].pow(2).mean().sub(1).abs() < 1e-4
    assert torch.all(adv[mask == 0] == 0)
    assert adv[0, 0] > 0 > adv[1, 0]


def test_sft_and_dpo_move_named_adapters():
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, adapter_name="generator")
    models.add_lora(model, r=4, adapter_name="verifier")
    examples = [("q", "abc"), ("p", "abd")] * 4
    cfg = dpo.PreferenceConfig(lr=1e-2, epochs=5, batch_size=4)   # at 5e-2 SFT on this tiny model diverges late
    rows = dpo.train_sft(model, tok, examples, cfg, adapter_name="generator", progress=False)
    assert rows[-1]["loss"] < rows[0]["loss"]
    pairs = [("q", "abc", "xyz"), ("p", "abd", "zzz")] * 4
    rows = dpo.train_dpo(model, tok, pairs, cfg, adapter_name="verifier", progress=False)
    assert rows[-1]["loss"] < rows[0]["loss"] and rows[-1]["accuracy"] == 1.0
    with pytest.raises(ValueError, match="dpo_beta=0"):
        dpo.PreferenceConfig(dpo_beta=0).validate()


def test_dpo_reference_choice_is_checked():
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    with pytest.raises(ValueError, match="reference"):
        dpo.train_dpo(model, tok, [("p", "a", "b")], dpo.PreferenceConfig(), progress=False, reference="sft")


def test_prompt_sharing_gives_the_plain_loss_and_gradient():
    """grouped_logps encodes each prompt once for its G completions: same GRPO loss and LoRA gradient (fp32, 1e-5)."""
    torch.manual_seed(0)
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    for p in training.trainable(model).values():
        torch.nn.init.normal_(p, std=0.05)
    texts = models.chat_prompts(tok, ["hello there", "a much longer prompt than the others", "x"])
    p_ids, p_mask, c_ids, c_mask = models.sample(model, tok, texts, 10, 1.0, repeats=4)
    c_mask[1, 3:] = 0  # replies of different lengths, as after an early EOS
    c_mask[6, 1:] = 0
    assert_grouped_matches_plain(model, p_ids, p_mask, c_ids, c_mask, group_size=4)


@pytest.mark.parametrize("overrides, message", [
    ({"top_p": 0.0}, "top_p=0.0"), ({"top_k": -1}, "top_k=-1"), ({"min_p": 1.5}, "min_p=1.5"),
])
def test_sampling_options_are_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        grpo.GRPOConfig(**overrides).validate()


def test_rollout_sampling_options_run_and_zero_gradient_groups_are_counted():
    trainer = make_trainer(top_p=0.9, top_k=20, min_p=0.05, temperature=0.7)
    row = trainer.step(PROMPTS, step=0)
    assert 0.0 <= row["zero_std_frac"] <= 1.0 and row["completion_len"] > 0


def test_sampling_copy_is_the_policy():
    """The rollout copy holds base + the active adapter's delta: fp32 logits equal the peft policy's; bf16 ones
    stay within the stated tolerance (next-token log-probs within 0.1 nats at the largest, on the tiny model)."""
    torch.manual_seed(0)
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    for p in training.trainable(model).values():
        torch.nn.init.normal_(p, std=0.05)
    ids = tok(["hello there", "go"], return_tensors="pt", padding=True)["input_ids"]
    with torch.no_grad():
        want = model(input_ids=ids).logits.log_softmax(-1)
        same = training.SamplingCopy(model, torch.float32).sync()(input_ids=ids).logits.log_softmax(-1)
        low = training.SamplingCopy(model).sync()(input_ids=ids).logits.float().log_softmax(-1)
    assert torch.allclose(want, same, atol=1e-5)
    assert (want - low).abs().max() < 0.1
    copy = training.SamplingCopy(model, torch.float32)
    with torch.no_grad():  # the copy follows the adapter after an update
        for p in training.trainable(model).values():
            p.add_(0.1)
        assert torch.allclose(model(input_ids=ids).logits, copy.sync()(input_ids=ids).logits, atol=1e-5)


def test_bf16_rollout_trainer_learns():
    trainer = make_trainer(rollout_dtype="bfloat16")
    rows = trainer.train(sampler, 30, progress=False)
    first, last = sum(r["reward_mean"] for r in rows[:5]) / 5, sum(r["reward_mean"] for r in rows[-5:]) / 5
    assert last > first + 0.3, (first, last)


def test_length_buckets_cut_sorted_rows_where_the_fewest_positions_are_computed():
    """training.length_buckets by hand: one bucket pads every row to the longest; two put the short rows apart."""
    assert training.length_buckets([5, 5, 5], 3) == [([0, 1, 2], 5)]            # one run is already the cheapest
    parts = training.length_buckets([48, 4, 48, 6, 5, 48], 2)
    assert parts == [([1, 4, 3], 6), ([0, 2, 5], 48)]                            # 3 x 6 + 3 x 48 = 162 < 6 x 48
    three = training.length_buckets([1, 2, 3, 10, 11, 30], 3)
    assert sum(len(r) * w for r, w in three) == 3 * 3 + 2 * 11 + 30 and sorted(i for r, _ in three for i in r) == list(range(6))


def test_length_buckets_give_the_plain_loss_and_gradient():
    """GRPO loss and LoRA gradient with the completions in length buckets equal one pass over all rows (fp32,
    1e-5): replies of different lengths in each group, the log-probs past a row's bucket 0 under mask 0."""
    torch.manual_seed(0)
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    for p in training.trainable(model).values():
        torch.nn.init.normal_(p, std=0.05)
    texts = models.chat_prompts(tok, ["1 + 1?", "A longer one: 7 + 5?"])
    p_ids, p_mask, c_ids, c_mask = models.sample(model, tok, texts, 10, 1.0, repeats=4)
    for row, n in enumerate([2, 10, 3, 9, 10, 1, 4, 6]):
        c_mask[row, n:] = 0
    adv = torch.randn(len(c_ids))

    def loss_and_grad(buckets):
        model.zero_grad()
        logps = training.grouped_logps(model, p_ids, p_mask, c_ids, c_mask, 4, 0.7, buckets=buckets)
        loss, _ = grpo.grpo_loss(logps, logps.detach(), logps.detach() - 0.1, adv, c_mask, kl_beta=0.04)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in training.trainable(model).items()}, logps.detach()

    plain, bucketed = loss_and_grad(1), loss_and_grad(3)
    assert len(training.length_buckets(c_mask.sum(1).tolist(), 3)) == 3               # the bucketed path is tested
    assert torch.allclose(plain[0], bucketed[0], atol=1e-5)
    assert all(torch.allclose(plain[1][k], bucketed[1][k], atol=1e-5) for k in plain[1])
    assert torch.allclose(plain[2] * c_mask, bucketed[2] * c_mask, atol=1e-5)
    assert max(g.abs().max() for g in plain[1].values()) > 1e-3
