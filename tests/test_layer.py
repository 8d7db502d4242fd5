"""The experiment layer: the one cache, the one resumable loop, parameter classes and paper numbers."""
import json

import pandas as pd
import pytest
import torch

from replication.run import settings, workbook  # noqa: F401
from replication.core import cache, paper, params
from replication.lm import loop, models  # noqa: F401


# ---- cache ---------------------------------------------------------------------------------------------

def test_cache_makes_once_and_reloads_every_kind(tmp_path):
    calls = []

    def make(value):
        def inner():
            calls.append(1)
            return value
        return inner

    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    state = {"w": torch.arange(3.0)}
    for name, value in (("json", {"x": [1, 2.5], "s": "t"}), ("frame", frame), ("torch", state)):
        first = cache.cached(tmp_path, name, {"k": 1}, make(value), log=None)
        again = cache.cached(tmp_path, name, {"k": 1}, make(value), log=None)
        if name == "frame":
            pd.testing.assert_frame_equal(again, frame)
        elif name == "torch":
            assert torch.equal(again["w"], state["w"])
        else:
            assert first == again == value
    assert len(calls) == 3


def test_cache_rebuilds_a_stale_key_and_a_corrupt_value(tmp_path):
    said = []
    assert cache.cached(tmp_path, "x", {"k": 1}, lambda: [1], log=said.append) == [1]
    assert cache.cached(tmp_path, "x", {"k": 2}, lambda: [2], log=said.append) == [2]  # another key, another entry
    path = cache.path_for(tmp_path, "x", {"k": 1})
    (path / "value.json").write_text("[9]")  # damaged on disk
    assert cache.cached(tmp_path, "x", {"k": 1}, lambda: [1], log=said.append) == [1]
    assert said == ["cache x: rebuilt (contents do not match their checksum)"]
    meta = json.loads((path / "meta.json").read_text())
    meta["key"] = {"k": 3}
    (path / "meta.json").write_text(json.dumps(meta))
    assert cache.load(path, {"k": 1}) == (None, "made for a different key")


def test_cache_name_is_checked(tmp_path):
    with pytest.raises(ValueError, match="name="):
        cache.cached(tmp_path, "a/b", {}, lambda: 1)


# ---- the loop ------------------------------------------------------------------------------------------

def tiny():
    torch.manual_seed(0)
    model, _ = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    return model, torch.optim.AdamW(loop.trainable(model).values(), lr=1e-2)


def step_fn(model, optimizer):
    """A step that moves the adapter by a random direction and counts in the loop state."""
    def step(i, state):
        for p in loop.trainable(model).values():
            p.grad = torch.randn_like(p)
        optimizer.step()
        optimizer.zero_grad()
        state["count"] = state.get("count", 0) + 1
        state.setdefault("seen", []).append(i)
        return {"value": float(torch.rand(()))}
    return step


def weights(model):
    return {k: v.detach().clone() for k, v in loop.trainable(model).items()}


def test_loop_resumes_exactly_and_finished_runs_load_final_weights(tmp_path):
    m1, o1 = tiny()
    rows1, state1 = loop.run(step_fn(m1, o1), 5, m1, o1, loop.RunFolder(tmp_path / "a"), save_every=2, progress=False)

    m2, o2 = tiny()
    folder = loop.RunFolder(tmp_path / "b")
    loop.run(step_fn(m2, o2), 5, m2, o2, folder, save_every=2, progress=False)
    (folder.path / "done.json").unlink()
    for p in sorted((folder.path / "checkpoints").glob("*.pt"))[-1:]:
        p.unlink()  # interrupted after step 4: resume from the checkpoint after step 4 (save_every=2)
    m3, o3 = tiny()
    rows3, state3 = loop.run(step_fn(m3, o3), 5, m3, o3, folder, save_every=2, progress=False)
    assert [r["value"] for r in rows3] == [r["value"] for r in rows1] and state3 == state1 == {"count": 5, "seen": [0, 1, 2, 3, 4]}
    assert all(torch.equal(a, b) for a, b in zip(weights(m1).values(), weights(m3).values()))

    m4, o4 = tiny()  # a finished run: no step runs, the final weights and state are loaded
    rows4, state4 = loop.run(lambda i, s: pytest.fail("a finished run must not step"), 5, m4, o4, folder, progress=False)
    assert rows4 == rows3 and state4["count"] == 5
    assert all(torch.equal(a, b) for a, b in zip(weights(m1).values(), weights(m4).values()))


def test_a_run_interrupted_before_its_first_checkpoint_logs_each_step_once(tmp_path):
    m1, o1 = tiny()
    rows1, _ = loop.run(step_fn(m1, o1), 3, m1, o1, loop.RunFolder(tmp_path / "a"), save_every=2, progress=False)
    folder = loop.RunFolder(tmp_path / "b")
    folder.log({"step": 0, "value": -1.0})   # an execution killed during step 1: step 0 logged, no checkpoint yet
    m2, o2 = tiny()
    rows2, _ = loop.run(step_fn(m2, o2), 3, m2, o2, folder, save_every=2, progress=False)
    assert [r["step"] for r in rows2] == [r["step"] for r in folder.rows()] == [0, 1, 2]
    assert [r["value"] for r in rows2] == [r["value"] for r in rows1]


def test_a_run_asked_for_fewer_steps_than_it_was_continued_to_answers_as_before_the_continuation(tmp_path):
    m1, o1 = tiny()
    folder = loop.RunFolder(tmp_path / "c")
    rows1, state1 = loop.run(step_fn(m1, o1), 4, m1, o1, folder, save_every=2, progress=False)
    w1 = weights(m1)
    m2, o2 = tiny()   # a later call continues the same run (notebook 00: the pick's run goes on from the sweep's)
    rows2, _ = loop.run(step_fn(m2, o2), 6, m2, o2, folder, save_every=2, progress=False)
    assert len(rows2) == 6 and rows2[:4] == rows1
    m3, o3 = tiny()   # the sweep asked again (a re-executed notebook): its 4 steps, weights and state, not the 6 steps'
    rows3, state3 = loop.run(lambda i, s: pytest.fail("a finished run must not step"), 4, m3, o3, folder, progress=False)
    assert rows3 == rows1 and state3 == state1 == {"count": 4, "seen": [0, 1, 2, 3]}
    assert all(torch.equal(a, b) for a, b in zip(w1.values(), weights(m3).values()))


def test_loop_keeps_only_the_newest_checkpoints(tmp_path):
    m, o = tiny()
    folder = loop.RunFolder(tmp_path / "k")
    loop.run(step_fn(m, o), 4, m, o, folder, save_every=1, keep=1, progress=False)
    assert [p.name for p in (folder.path / "checkpoints").glob("*.pt")] == ["step_000004.pt"]


# ---- parameters, paper numbers, seeds -------------------------------------------------------------------

def cell_03():
    return {"profile": "smoke", "seed": 0, "model": "m", "device": "auto", "n_arithmetic": 4, "n_factual": 2,
            "samples": 2, "temperature": 0.8, "max_new_tokens": 16, "batch_size": 8, "n_boot": 50,
            "level": "1d-1step-add", "shots": 1, "styles": ["digits"], "n_train": 4, "n_heldout": 8, "steps": 2,
            "prompts_per_step": 2, "group_size": 2, "rollout_dtype": "bfloat16", "lr": 1e-4, "lora_r": 8,
            "warmup_start": 0, "warmup_end": 1, "max_rollouts": 2, "seeds": 1,
            "variants": ["rlpr", "rlvr"], "workers": 1}


@pytest.mark.parametrize("change, message", [
    ({"steps": 0}, "steps=0"), ({"temperature": 5.0}, "temperature=5.0"), ({"profile": "fast"}, "profile='fast'"),
    ({"variants": ["rlpr", "ppo"]}, "variants='ppo'"), ({"warmup_end": 0}, "warmup_end=0"),
    ({"prompts_per_step": 7}, "prompts_per_step=7"), ({"rollout_dtype": "fp16"}, "rollout_dtype='fp16'"), ({"lr": "fast"}, "lr='fast'"), ({"seed": -1}, "seed=-1"),
    ({"workers": 0}, "workers=0"),
])
def test_parameters_name_the_bad_value(change, message):
    params.build("03_rlpr_debiasing", cell_03())
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        params.build("03_rlpr_debiasing", {**cell_03(), **change})


def test_a_learning_rate_has_one_range_wherever_it_is_checked():
    """The parameters and the trainers accept the same learning rates (config.LR_RANGE), so a value the notebook
    accepts is never refused deep in a run, nor the other way round."""
    from replication.core import config
    from replication.lm import dpo, grpo

    lo, hi = config.LR_RANGE
    for lr in (lo, 1e-4, hi):
        params.build("03_rlpr_debiasing", {**cell_03(), "lr": lr})
        grpo.GRPOConfig(lr=lr).validate()
        dpo.PreferenceConfig(lr=lr).validate()
    for lr in (hi * 2, -1e-6):
        for check in (lambda: params.build("03_rlpr_debiasing", {**cell_03(), "lr": lr}),
                      lambda: grpo.GRPOConfig(lr=lr).validate(), lambda: dpo.PreferenceConfig(lr=lr).validate()):
            with pytest.raises(ValueError, match="lr="):
                check()
    lrs = {c.__name__: [f for f in c.__dataclass_fields__.values() if f.name.endswith("lr")]
           for c in params.REGISTRY.values()}
    assert all(f.metadata["high"] == hi for fs in lrs.values() for f in fs) and sum(map(len, lrs.values())) >= 5


def test_parameters_missing_and_unknown_notebook():
    cell = cell_03()
    del cell["steps"]
    with pytest.raises(ValueError, match="lacks steps"):
        params.build("03_rlpr_debiasing", cell)
    with pytest.raises(ValueError, match="notebook='99_x'"):
        params.build("99_x", cell)


def test_paper_numbers_come_with_their_source():
    assert paper.value("elo_evolve_temperature", quantity="start_rating") == pytest.approx(1350)
    assert "Algorithm 1" in paper.cite("elo_evolve_temperature", quantity="start_rating")
    with pytest.raises(ValueError, match="rows"):
        paper.value("elo_evolve_temperature", quantity="opponent_rating")  # several rows: name one
    with pytest.raises(ValueError, match="table='nope'"):
        paper.table("nope")


def test_derived_seeds_are_stable_and_distinct():
    from replication.core import config

    assert config.derive_seed(0, "step", 1) == config.derive_seed(0, "step", 1)
    assert len({config.derive_seed(s, "step", i) for s in range(3) for i in range(50)}) == 150
    assert 0 <= config.derive_seed(7, "x") < 2**63
