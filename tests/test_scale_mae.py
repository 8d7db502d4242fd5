"""Multi-Agent Evolve on TRL (replication.scale.trl_mae) against the workbook's own iteration on one batch of the tiny
model: the same rewards, per-role advantages and loss."""
import dataclasses

import pytest
import torch

from replication.core import config
from replication.lm import loop, tasks
from replication.papers.mae import mae

trl = pytest.importorskip("trl")
trl_mae = pytest.importorskip("replication.scale.trl_mae")
from replication.scale import configs, train  # noqa: E402  (needs trl)

TINY = config.ROOT / "configs" / "tiny" / "mae.yaml"
QUESTION = "Tom has 4 apples and gets 3 more apples. How many apples does Tom have?</question>"


def mixed(call: int, prefill: str, texts: list) -> list:
    """Replies that give every role mixed rewards (the random tiny model writes no tag and states no answer): every
    other proposal closes a question, every other judgment a score, every other answer states one."""
    if prefill == mae.QUESTION_PREFILL:
        fill = [QUESTION, ""]
    elif prefill == mae.SCORE_PREFILL:
        fill = ["<score>9</score> Clear.", "<score>2</score> Wrong.", ""]
    else:
        fill = ["The answer is 7.", ""]
    return [fill[(i + call) % len(fill)] or t for i, t in enumerate(texts)]


def mae_trainer(tmp_path, sets=()):
    """The train command's MAE trainer on the tiny config, its LoRA weights moved off zero, and its generate
    wrapped to give mixed rewards and record every call (for replay)."""
    cfg = configs.read_config("mae", TINY, [f"output_dir={tmp_path}", *sets])
    trainer, _, _ = train.build("mae", cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    calls, real = [], trainer.generate

    def generate(prompts, tokens, prefill="", repeats=1):
        out = real(prompts, tokens, prefill, repeats)
        out = {**out, "texts": mixed(len(calls), prefill, out["texts"])}
        calls.append({"prompts": prompts, "tokens": tokens, "prefill": prefill, "repeats": repeats, "out": out})
        return out

    trainer.generate = generate
    trainer.current_gradient_accumulation_steps = 1
    return cfg, trainer, calls


def replay(calls):
    """A generate for mae.collect that returns the recorded calls in order (and checks it is asked the same)."""
    calls = list(calls)

    def generate(prompts, tokens, prefill="", repeats=1):
        call = calls.pop(0)
        assert (call["prompts"], call["tokens"], call["prefill"], call["repeats"]) == (prompts, tokens, prefill, repeats)
        return call["out"]
    return generate


def test_mae_rewards_advantages_and_loss_match_the_workbook(tmp_path):
    cfg, trainer, calls = mae_trainer(tmp_path)
    seeds = tasks.make_level(cfg["data"]["level"], cfg["data"]["n_seed_questions"], seed=cfg["seed"])
    trainer.model.train()
    out = trainer._generate_and_score_completions([])
    loss = trainer.compute_loss(trainer.model, out)
    # the workbook's own iteration on the same replies: rewards, per-role advantages, the joint update's loss
    mcfg = configs.mae_config(cfg)
    wb = mae.collect(replay(calls), mae.QuestionPool.from_problems(seeds), mcfg, 0)
    chunks = wb["chunks"]
    roles = [role for role, gen, rewards in chunks for _ in rewards]
    rewards = torch.tensor([r for _, _, rs in chunks for r in rs])
    assert roles == trainer.last["roles"] and set(roles) == {"proposer", "solver", "judge"}
    assert torch.equal(rewards, torch.tensor(trainer.last["rewards"]))
    for role in set(roles):  # every role's rewards are mixed, so every role carries a gradient
        assert rewards[[r == role for r in roles]].std() > 0, role
    advs = mae.role_advantages([c[2] for c in chunks], [c[1]["ids"][3] for c in chunks], [c[0] for c in chunks])
    for a, (_, gen, _) in zip(advs, chunks):  # constant along each reply (no KL, gamma 1)
        m = gen["ids"][3].bool()
        assert torch.allclose(a[m], a[:, :1].expand_as(a)[m], atol=1e-6)
    want = torch.cat([a[:, 0] for a in advs])
    got = out["advantages"]
    print(f"MAE advantages: max abs difference {float((got - want).abs().max()):.2e} over {len(want)} rows")
    assert torch.allclose(got, want, atol=1e-6, rtol=0) and got.abs().sum() > 0
    # on policy the loss is 0 by construction (each role's token-weighted advantages sum to 0): compare gradients
    params = list(loop.trainable(trainer.model).values())
    loss.backward()
    trl_grads = [p.grad.detach().clone() for p in params]
    trainer.model.zero_grad(set_to_none=True)
    opt = Capture(params)
    ours = mae.joint_update(trainer.model, opt, chunks, dataclasses.replace(mcfg, max_grad_norm=1e9))
    assert abs(float(loss.detach())) < 1e-6 and abs(ours["loss"]) < 1e-6 and abs(float(loss.detach()) - ours["loss"]) < 1e-6
    scale = max(float(g.abs().max()) for g in opt.grads)
    diff = max(float((a - b).abs().max()) for a, b in zip(trl_grads, opt.grads))
    print(f"MAE gradient: max abs difference {diff:.2e} (largest entry {scale:.2e}); loss TRL {float(loss):.2e}, "
          f"workbook {ours['loss']:.2e}")
    # 1e-5 of the largest entry, not 1e-6: TRL numbers positions from the left-padded row's first column and the
    # workbook from its first real token (models.position_ids); RoPE makes that the same math, rounded otherwise
    # (per-token log-probs differ by up to ~6e-6 here)
    assert scale > 1e-3 and diff < 1e-5 * scale


class Capture(torch.optim.SGD):
    """An optimizer that keeps the gradients it is asked to step with and changes nothing."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.grads = None

    def step(self, closure=None):
        self.grads = [p.grad.detach().clone() for p in self.param_groups[0]["params"]]


def test_role_advantages_from_rows_equal_the_workbooks_on_masks():
    rows = [("proposer", 0.2, 3), ("proposer", 0.9, 5), ("solver", 0.5, 2), ("judge", 1.0, 4), ("solver", 0.0, 6),
            ("judge", 0.0, 1), ("judge", 1.0, 2)]
    got = trl_mae.role_advantages(rows)
    want = mae.role_advantages([[r] for _, r, _ in rows], [torch.ones((1, n)) for *_, n in rows], [x for x, _, _ in rows])
    assert got == [float(a[0, 0]) for a in want] and len(set(got)) > 3
    same = trl_mae.role_advantages([("judge", 1.0, 3), ("judge", 1.0, 5)])
    assert same == [0.0, 0.0]


def test_pool_state_round_trips_and_bad_settings_are_named(tmp_path):
    _, trainer, _ = mae_trainer(tmp_path)
    trainer.pool.add("What is 1 + 1?", 0.9, 0)
    state = trainer.state_dict()
    trainer.pool.items, trainer.iterations = [], 5
    trainer.load_state_dict(state)
    assert trainer.pool.items[-1]["question"] == "What is 1 + 1?" and trainer.iterations == 0
    path = tmp_path / "c.yaml"
    for text, name in (("mae: {proposal: 2}", r"mae\.proposal"), ("mae: {judge: oracle}", "judge='oracle'"),
                       ("mae: {score_rule: first}", "score_rule"), ("data: {n_seed_questions: 0}", "data.n_seed_questions")):
        path.write_text(text)
        with pytest.raises(ValueError, match=name):
            configs.read_config("mae", path)
    for sets, name in ((["trl.beta=0.04"], "trl.beta"), (["trl.loss_type=grpo"], "trl.loss_type")):
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            mae_trainer(tmp_path, sets)


def test_paper_config_holds_the_papers_settings():
    from replication.core import paper

    cfg = configs.read_config("mae", config.ROOT / "configs" / "paper" / "mae.yaml")
    P = paper.table("mae_settings").set_index("quantity")["value"].astype(float)
    t, m = cfg["trl"], cfg["mae"]
    assert (t["learning_rate"], t["beta"], t["temperature"], t["max_steps"]) == (P["lr"], P["kl_coef"], P["temperature"], P["steps"])
    assert (m["n_solve"], m["reference_ratio"], m["quality_threshold"]) == (P["n_solve"], P["reference_ratio"], P["quality_threshold"])
    assert m["proposals"] * 8 == P["batch_per_role"]  # per process, on 8 GPUs
    assert configs.mae_config(cfg).judge == "self" and t["loss_type"] == "dapo"
