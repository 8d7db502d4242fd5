"""The model-based rewards and judges put the inputs they build on the model's device (a GPU at scale).

There is no second device here, so the tiny model is moved to PyTorch's `meta` device (shapes only): every tensor
that reaches its forward is recorded, and must be on `meta`, as it would have to be on the GPU. A tensor built on
the CPU and not moved shows up as "cpu". The paths stop at the first step that reads values (meta tensors hold
none; the shared-prompt check is skipped on meta); the inputs of the forwards before it are checked."""
import pytest
import torch

from replication.lm import dpo, judges, models, tasks
from replication.papers.elo_evolve import judging
from replication.papers.rlpr import rlpr


def meta_model():
    model, tok = models.tiny_model(seed=0)
    model.to("meta")
    seen = []

    def hook(module, args, kwargs):
        seen.extend(t.device.type for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return model, tok, seen


PROBLEMS = tasks.make_level("1d-1step-add", 2, seed=0)
PATHS = {
    "rlpr scoring": lambda m, t: rlpr.baseline_probs(m, t, [p.prompt() for p in PROBLEMS], [str(p.answer) for p in PROBLEMS]),
    "likelihood judge": lambda m, t: judging.LikelihoodJudge(m, t).p_win(
        [p.question for p in PROBLEMS], [p.answer for p in PROBLEMS], ["The answer is 3.", "4"], ["5", "The answer is 6."]),
    "likelihood judge, worked examples": lambda m, t: judging.LikelihoodJudge(m, t, PROBLEMS[:1]).p_win(
        [PROBLEMS[1].question], [PROBLEMS[1].answer], ["The answer is 3."], ["5"]),
    "llm judge": lambda m, t: judging.LLMJudge(m, t).p_win(
        [p.question for p in PROBLEMS], [p.answer for p in PROBLEMS], ["The answer is 3.", "4"], ["5", "6"]),
    "response log-probs": lambda m, t: judges.response_logps(m, t, [p.question for p in PROBLEMS], ["3", "4"]),
    "sampling (opponent pool, MAE, MALT trees)": lambda m, t: models.sample(m, t, models.chat_prompts(
        t, [p.prompt() for p in PROBLEMS]), 4, 1.0, repeats=2),
    "sft / dpo log-probs": lambda m, t: dpo._seq_sums(m, t, [p.prompt() for p in PROBLEMS], ["3", "4"], None),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_inputs_are_built_on_the_models_device(path, monkeypatch):
    model, tok, seen = meta_model()
    real = models.common_prefix  # reads token values: on meta tensors, no shared run (encode prompts as given)
    monkeypatch.setattr(models, "common_prefix", lambda ids, mask: real(ids, mask) if ids.device.type != "meta" else 0)
    try:
        PATHS[path](model, tok)
    except (NotImplementedError, RuntimeError, ValueError) as e:  # a step that reads values of meta tensors
        assert "device" not in str(e) or "meta" in str(e).split("device")[0], e
    assert seen, "the path must reach the model"
    assert set(seen) == {"meta"}, f"{path}: inputs on {sorted(set(seen) - {'meta'})}, the model on meta"
