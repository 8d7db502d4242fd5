"""The rollout record: selecting rows and groups, joining rollouts with re-padding, side data travelling with
their rows, and GRPOTrainer.collect's keep hook refilling a batch from a second rollout."""
import pytest
import torch

from replication.lm import grpo, models
from replication.lm.rollout import Recorder, Rollout


def hand_rollout(prompt_len=2, completion_len=3, offset=0, extras=True):
    """Two groups of two rows; row i's ids all equal offset + i (padding: id 0 on the left / right)."""
    B, G = 4, 2
    ids = torch.arange(offset + 1, offset + B + 1)
    p_ids = ids[:, None].repeat(1, prompt_len)
    c_ids = ids[:, None].repeat(1, completion_len)
    return Rollout(p_ids, torch.ones_like(p_ids), c_ids, torch.ones_like(c_ids), [f"c{offset + i}" for i in range(B)],
                   rewards=torch.tensor([0.0, 1.0, 0.5, 0.5]) + offset, group_size=G,
                   advantages=torch.tensor([-1.0, 1.0, 0.0, 0.0]), zero_std=torch.tensor([False, False, True, True]),
                   ref_logps=-torch.ones(B, completion_len), metrics={"m": 1.0},
                   extras={"r": [offset + i for i in range(B)], "correct": [i % 2 == 0 for i in range(B)]} if extras else {})


def test_select_takes_every_per_row_field_and_extra():
    r = hand_rollout()
    s = r.select([3, 1])
    assert s.completions == ["c3", "c1"] and s.rewards.tolist() == [0.5, 1.0] and s.extras["r"] == [3, 1]
    assert s.extras["correct"] == [False, False] and s.prompt_ids[:, 0].tolist() == [4, 2]
    assert s.ref_logps.shape == (2, 3) and s.zero_std.tolist() == [True, False] and s.metrics == {"m": 1.0}
    assert s.group_size == 2 and len(r) == 4   # the original is untouched


def test_groups_keeps_whole_groups_and_group_std():
    r = hand_rollout()
    assert r.group_std().tolist() == pytest.approx([2 ** -0.5, 0.0])
    g = r.groups([False, True])
    assert g.completions == ["c2", "c3"] and g.extras["r"] == [2, 3] and len(g.group_std()) == 1
    assert len(r.groups([False, False])) == 0


def test_concat_repads_prompts_left_and_completions_right():
    a, b = hand_rollout(prompt_len=2, completion_len=3), hand_rollout(prompt_len=4, completion_len=1, offset=10)
    m = Rollout.concat([a, b], pad_id=0)
    assert m.prompt_ids.shape == (8, 4) and m.completion_ids.shape == (8, 3)
    assert m.prompt_ids[0].tolist() == [0, 0, 1, 1] and m.prompt_mask[0].tolist() == [0, 0, 1, 1]
    assert m.completion_ids[4].tolist() == [11, 0, 0] and m.completion_mask[4].tolist() == [1, 0, 0]
    assert m.ref_logps[4].tolist() == [-1.0, 0.0, 0.0]
    assert m.completions == a.completions + b.completions and m.extras["r"] == a.extras["r"] + b.extras["r"]
    assert m.rewards.tolist() == a.rewards.tolist() + b.rewards.tolist() and m.old_logps is None
    assert Rollout.concat([a], pad_id=0) is a
    missing = Rollout.concat([a, hand_rollout(offset=10, extras=False)], pad_id=0)
    assert missing.extras["r"] == a.extras["r"] + [None] * 4
    odd = hand_rollout()
    odd.group_size = 4
    with pytest.raises(ValueError, match="group sizes"):
        Rollout.concat([a, odd], pad_id=0)


def test_recorder_checks_one_value_per_completion():
    rec = Recorder(2)
    rec.log_metric("x", 3)
    rec.log_extra("y", (1, 2))
    assert rec.metrics == {"x": 3.0} and rec.extras == {"y": [1, 2]}
    with pytest.raises(ValueError, match="log_extra\\('y'\\) got 3 values for 2 completions"):
        rec.log_extra("y", [1, 2, 3])


def length_reward(prompts, completions, metadata, log_metric=None, log_extra=None):
    log_extra("prompt", list(prompts))
    log_metric("n", len(completions))
    return [float(len(c)) for c in completions]


def make_trainer(G=2):
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    cfg = grpo.GRPOConfig(num_generations=G, max_new_tokens=5, lr=1e-2, kl_beta=0.04, seed=0)
    return grpo.GRPOTrainer(model, tok, length_reward, cfg)


def test_concat_of_real_rollouts_is_a_valid_update_batch():
    trainer = make_trainer(G=4)
    torch.manual_seed(0)
    b1 = trainer.rollout(["a"])
    b2 = trainer.rollout(["a much longer prompt here"])
    m = Rollout.concat([b1, b2], trainer.tok.pad_token_id)
    for k, b in enumerate([b1, b2]):
        for i in range(4):
            row = 4 * k + i
            assert m.prompt_ids[row][m.prompt_mask[row].bool()].tolist() == b.prompt_ids[i][b.prompt_mask[i].bool()].tolist()
            assert m.completion_ids[row][m.completion_mask[row].bool()].tolist() == \
                b.completion_ids[i][b.completion_mask[i].bool()].tolist()
    assert m.extras["prompt"] == ["a"] * 4 + ["a much longer prompt here"] * 4
    out = trainer.update(m)   # the joined batch is a valid update batch
    assert out["grad_norm"] >= 0 and m.ref_logps.shape == m.completion_ids.shape


def test_collect_refills_from_a_second_rollout_through_the_keep_hook():
    trainer = make_trainer(G=2)
    prompts = [["p0", "p1"], ["q0", "q1"], ["r0", "r1"]]
    draws = []

    def draw(attempt):
        draws.append(attempt)
        torch.manual_seed(attempt)
        return prompts[attempt], [{} for _ in prompts[attempt]]

    keep = lambda rollout: [True, False]  # noqa: E731  (half of each rollout's prompts)
    kept, made = trainer.collect(draw, groups=2, keep=keep, max_rollouts=3)
    assert draws == [0, 1] and len(made) == 2          # the second rollout filled the batch; no third
    assert kept.extras["prompt"] == ["p0", "p0", "q0", "q0"]
    assert kept.completions == made[0].completions[:2] + made[1].completions[:2]
    assert kept.rewards.tolist() == made[0].rewards[:2].tolist() + made[1].rewards[:2].tolist()
    assert made[0].metrics == {"n": 4.0}
    full, made = trainer.collect(draw, groups=1, max_rollouts=3)
    assert len(made) == 1 and len(full) == 2 and full.extras["prompt"] == ["p0", "p0"]   # truncated to `groups`
    none, made = trainer.collect(draw, groups=2, keep=lambda r: [False, False], max_rollouts=2)
    assert none is None and len(made) == 2
