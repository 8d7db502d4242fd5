"""Notebook 05's multi-agent question: the single-agent control's data (its own labels, exactly MALT's generator
budget), the first answers known to be wrong and known to be right (wrong by the exact verifier, off by exactly k),
fix/break counting and its intervals, MALT's generator alone and the reading lines."""
import numpy as np
import pytest
import torch

from replication.core import cache, config, stats
from replication.lm import dpo, models, tasks
from replication.papers.malt import control, known_answers, malt, malt_eval, malt_training


def answer_tree(n=3, questions=6, seed=0, right=0.7, leaves=0.4):
    """A tree of `questions` level-1 problems whose generator samples state the right answer with probability `right`
    and whose leaf rewards are drawn independently, 1 with probability `leaves` (so MALT's labels and the generator's
    own labels differ, and MALT's generator has fewer positives than right samples, as in the notebook's trees)."""
    rng = np.random.default_rng(seed)
    problems = tasks.make_level("1d-1step-add", questions, seed=seed)
    g = [p.solution if rng.random() < right else f"The answer is {p.answer + 1}." for p in problems for _ in range(n)]
    return {"n": n, "questions": [p.question for p in problems], "answers": [p.answer for p in problems], "g": g,
            "v": [f"v{i}" for i in range(questions * n**2)], "r": [f"r{i}" for i in range(questions * n**3)],
            "reward": (rng.random(questions * n**3) < leaves).astype(int).tolist(), "shots": []}


def test_own_labels_are_the_exact_verifier_on_each_generator_sample():
    tree = answer_tree()
    lab = control.own_labels(tree)
    assert lab.shape == (6, 3)
    want = [[tasks.verify(tree["g"][q * 3 + j], tree["answers"][q]) for j in range(3)] for q in range(6)]
    np.testing.assert_array_equal(lab, want)
    sft, pairs = control.own_data(tree)
    assert len(sft) == lab.sum() and all(tasks.verify(c, a) for (p, c), a in
                                         zip(sft, [tree["answers"][q] for q, _ in zip(*np.nonzero(lab))]))
    assert len(pairs) == sum(int(r.sum()) * int((~r).sum()) for r in lab)
    for prompt, chosen, rejected in pairs:       # chosen right, rejected wrong, both samples of the prompt's question
        q = next(i for i, x in enumerate(tree["questions"]) if malt.generator_prompt(x) == prompt)
        assert tasks.verify(chosen, tree["answers"][q]) and not tasks.verify(rejected, tree["answers"][q])
        assert {chosen, rejected} <= set(tree["g"][q * 3:q * 3 + 3])


@pytest.mark.parametrize("limits", [(48, 48), (3, 2), (1, 1)])
def test_the_control_trains_on_exactly_as_many_examples_and_pairs_as_malts_generator(limits):
    tree, val = answer_tree(seed=1, questions=12), answer_tree(seed=2)
    sets, _ = malt.training_sets(tree, val, *limits, seed=5)
    for pooling in malt.POOLINGS:
        out = control.control_sets(tree, val, sets[pooling], *limits, seed=5)
        (sft, pairs), (val_sft, val_pairs) = out["sets"], out["validation"]
        assert out["budget"] == {"sft": len(sets[pooling][0]["generator"]), "pairs": len(sets[pooling][1]["generator"])}
        assert out["short"] == {"sft": 0, "pairs": 0} and out["budget"]["sft"] > 0 and out["budget"]["pairs"] > 0
        assert len(sft["generator"]) == len(sets[pooling][0]["generator"])          # the same number of examples
        assert len(pairs["generator"]) == len(sets[pooling][1]["generator"])        # and of pairs
        assert all(sft[r] == [] and pairs[r] == [] for r in ("verifier", "refiner"))
        own_sft, own_pairs = control.own_data(tree)
        assert set(sft["generator"]) <= set(own_sft) and set(pairs["generator"]) <= set(own_pairs)
        assert len(val_sft["generator"]) <= limits[0] and len(val_pairs["generator"]) <= limits[1]
        assert out == control.control_sets(tree, val, sets[pooling], *limits, seed=5)       # seeded


def test_the_control_says_when_its_trees_cannot_meet_the_budget():
    tree = answer_tree(seed=3)
    own_sft, own_pairs = control.own_data(tree)
    big = ({"generator": [("p", "c")] * (len(own_sft) + 4)}, {"generator": [("p", "c", "r")] * (len(own_pairs) + 1)})
    out = control.control_sets(tree, tree, big, 100, 100, seed=0)
    assert out["short"] == {"sft": 4, "pairs": 1} and len(out["sets"][0]["generator"]) == len(own_sft)
    none = control.control_sets(tree, tree, ({"generator": []}, {"generator": []}), 8, 8, seed=0)
    assert none["sets"][0]["generator"] == [] and none["short"] == {"sft": 0, "pairs": 0}


def test_the_control_arm_trains_the_generator_only(tmp_path):
    model, tok = models.tiny_model(seed=0)
    model = malt_training.add_role_adapters(model, r=4, alpha=8)
    init = {r: malt_training.adapter_state(model, r) for r in malt.ROLES}
    tree = answer_tree(seed=4)
    sets, val = malt.training_sets(tree, tree, 4, 4, seed=0)
    own = control.control_sets(tree, tree, sets["global"], 4, 4, seed=0)
    cfg = dpo.PreferenceConfig(lr=1e-2, epochs=1, batch_size=4, dpo_beta=0.1, seed=0)
    arm = malt_training.train_arm(lambda name, key, make: cache.cached(tmp_path, name, key, make), {"k": 1}, "single",
                                  model, tok, init, (own["sets"], own["validation"]), malt_training.Recipe(cfg, cfg))
    moved = {r: any(not torch.equal(init[r][k], arm["dpo"]["weights"][r][k]) for k in init[r]) for r in malt.ROLES}
    assert moved == {"generator": True, "verifier": False, "refiner": False}
    assert len(arm["logs"]["generator"]["sft"]) == 1 and arm["logs"]["verifier"] == {"sft": [], "dpo": []}


LEVELS = ("1d-1step-add", "2d-1step-add", "2d-2step-addsub", "1d-2step-mixed")


@pytest.mark.parametrize("level", LEVELS)
def test_off_by_k_is_wrong_by_exactly_k_and_keeps_the_earlier_steps(level):
    for p in tasks.make_level(level, 5, seed=1):
        assert tasks.verify(p.solution, p.answer, strict=True)
        for k in (-10, -3, -1, 1, 2, 10):
            text = known_answers.off_by_k(p, k)
            assert tasks.extract_answer(text, strict=True) == p.answer + k and not tasks.verify(text, p.answer)
            last = p.solution.rpartition("The answer is ")[0].rstrip().rpartition(". ")
            assert text.startswith(last[0]) and f"= {p.answer + k}. The answer is {p.answer + k}." in text


def test_first_answers_are_known_right_and_wrong_seeded_and_never_negative():
    problems = tasks.make_level("2d-1step-add", 40, seed=0)
    first = known_answers.first_answers(problems, seed=3)
    assert first == known_answers.first_answers(problems, seed=3) and first != known_answers.first_answers(problems, seed=4)
    assert first["right"] == [p.solution for p in problems]
    assert all(tasks.verify(r, p.answer) and not tasks.verify(w, p.answer)
               for p, r, w in zip(problems, first["right"], first["wrong"]))
    assert all(0 < abs(k) <= known_answers.K_MAX for k in first["k"]) and {k > 0 for k in first["k"]} == {True, False}
    assert [tasks.extract_answer(w) - p.answer for p, w in zip(problems, first["wrong"])] == first["k"]
    small = [tasks.Problem("s", "Q?", 1, 1, 1, "+", "0 + 1 = 1. The answer is 1.")] * 30
    assert all(tasks.extract_answer(w) >= 0 for w in known_answers.first_answers(small, seed=0)["wrong"])
    with pytest.raises(ValueError, match="not known right"):
        known_answers.first_answers([tasks.Problem("b", "Q?", 5, 1, 1, "+", "2 + 2 = 4. The answer is 4.")])


def probe_rows(wrong_final, right_final, wrong=(9, 8, 7), truth=(5, 6, 7)):
    """continue_chains' rows by hand: three questions, their wrong first answers (wrong) then their right ones."""
    rows = []
    for i, (g, final) in enumerate(zip(list(wrong) + list(truth), list(wrong_final) + list(right_final))):
        q, a = i % 3, truth[i % 3]
        rows.append({"question": i, "chain": 0, "answer": a, "g_answer": g, "g_correct": g == a, "final_answer": final,
                     "correct": final == a})
    return rows


def test_fix_and_break_counting_by_hand():
    # known-wrong: q0 fixed (5), q1 kept its wrong 8, q2 changed to another wrong 3; known-right: q0 kept, q1 broken, q2 kept
    out = known_answers.outcomes(probe_rows([5, 8, 3], [5, 1, 7], wrong=(9, 8, 4)))
    assert {k: v.tolist() for k, v in out.items()} == {"fixed": [1, 0, 0], "broken": [0, 1, 0], "kept_wrong": [0, 1, 0],
                                                       "kept_right": [1, 0, 1]}
    with pytest.raises(ValueError, match="known-wrong"):
        known_answers.outcomes(probe_rows([5, 8, 3], [5, 1, 7], wrong=(5, 8, 4)))     # q0's "wrong" answer is right


def test_probe_summary_over_seeds_with_intervals_and_the_comparison_with_the_untrained_roles():
    untrained = probe_rows([9, 8, 4], [5, 6, 1], wrong=(9, 8, 4))           # fixes none, breaks one
    seeds = [probe_rows([5, 6, 4], [5, 6, 7], wrong=(9, 8, 4)), probe_rows([5, 8, 4], [5, 1, 7], wrong=(9, 8, 4))]
    probe = [{"untrained": untrained, "dpo": s} for s in seeds]
    records = {"MALT (global pooling)": [{"healthy": True, "failed_checks": []}] * 2,
               "untrained G-V-R": {"healthy": True, "failed_checks": []}}
    out = known_answers.summary(probe, ("untrained", "dpo"), records, n_boot=300, seed=1)
    u, t = out["untrained"], out["dpo"]
    assert (u["fixed"], u["broken"], u["seeds"], u["n"]) == (0, 1, 1, "1 seed x 3 questions")
    assert u["fixed_rate"] == {"rate": 0.0, "ci95": list(stats.proportion_ci(0, 3)[1:]), "per_seed": [0.0]}   # Wilson
    assert (t["fixed"], t["broken"], t["n"]) == (3, 1, "2 seeds x 3 questions")
    fixed = np.array([[1, 1, 0], [1, 0, 0]], float)
    assert t["fixed_rate"]["ci95"] == list(stats.two_level_bootstrap(fixed, n_boot=300, seed=1, bounds=(0, 1))[1:])
    assert t["fixed_rate"]["ci95"][0] == 0.0   # a rate's interval stays inside [0, 1] (unclipped it reaches below 0)
    net = fixed - np.array([[0, 0, 0], [0, 1, 0]])
    assert (t["net"], *t["ci95"]) == stats.two_level_bootstrap(net, n_boot=300, seed=1, bounds=(-1, 1))
    assert t["per_seed"] == pytest.approx([2 / 3, 0.0])
    gain = out["trained - untrained"]["fixed"]                                # paired by question, untrained with each seed
    assert gain["difference"] == pytest.approx(0.5) and gain["per_seed"] == pytest.approx([2 / 3, 1 / 3])
    assert out["trained - untrained"]["broken"]["difference"] == pytest.approx(1 / 6 - 1 / 3)


def test_continue_chains_puts_the_wrong_first_answers_first(tmp_path):
    model, tok = models.tiny_model(seed=0)
    model = malt_training.add_role_adapters(model, r=4, alpha=8)
    problems = tasks.make_level("1d-1step-add", 3, seed=0)
    first = known_answers.first_answers(problems, seed=0)
    keys = []

    def cached(name, key, make):
        keys.append((name, key))
        return cache.cached(tmp_path, name, key, make)

    rows = known_answers.continue_chains(cached, {"base": 1}, "dpo", model, tok, problems, first, trained=True,
                                         tokens=(4, 3, 4), temperature=1.0, seed=0, batch_size=8)
    assert [r["g"] for r in rows] == first["wrong"] + first["right"]
    assert [r["g_correct"] for r in rows] == [False] * 3 + [True] * 3
    assert keys[0][0] == "eval-known-dpo" and keys[0][1]["first answers"] == known_answers.KIND
    assert set(known_answers.outcomes(rows)) == {"fixed", "broken", "kept_wrong", "kept_right"}


def test_generator_alone_reads_the_chains_first_answers():
    rows = probe_rows([5, 8, 3], [5, 1, 7], wrong=(9, 8, 4))
    alone = malt_eval.generator_alone(rows)
    assert [r["correct"] for r in alone] == [r["g_correct"] for r in rows]
    assert [r["final_answer"] for r in alone] == [r["g_answer"] for r in rows] and all(r["r"] is None for r in alone)
    assert malt_eval.reply_stats([{**r, "g": "The answer is 5."} for r in alone])["kept_generator_answer"] == 1.0


def test_gain_sources_name_each_intervals_side():
    names = ("MALT's generator alone vs base generator (single)", "MALT vs its generator alone (single)",
             "MALT vs single-agent control (single)", "MALT's generator alone vs single-agent control (single)")
    diffs = {n: {"diff": d, "ci95": ci} for n, d, ci in zip(names, (0.2, 0.0, -0.05, 0.1),
                                                             ([0.1, 0.3], [-0.01, 0.01], [-0.09, -0.01], [-0.02, 0.2]))}
    known = {"fixed_rate": {"rate": 0.02, "ci95": [0.01, 0.05]}, "broken_rate": {"rate": 0.01, "ci95": [0.0, 0.03]},
             "net": 0.01, "ci95": [-0.01, 0.04]}
    lines = malt_eval.gain_sources(diffs, known, {"wrong_to_right": 0, "right_to_wrong": 4, "chains": 900})
    assert [line.rsplit("(", 1)[-1] for line in lines[:4]] == ["above zero)", "holds zero)", "below zero)", "holds zero)"]
    assert "fixed 0.02 [0.01, 0.05]" in lines[4] and "0 wrong -> right and 4 right -> wrong of 900" in lines[5]


def test_malt_against_the_control_and_its_own_generator_paired_by_question():
    truth = 5
    dpo_rows = [{"question": q, "chain": c, "answer": truth, "g_answer": g, "g_correct": g == truth, "final_answer": f,
                 "correct": f == truth} for q, c, g, f in ((0, 0, 4, 5), (0, 1, 5, 5), (0, 2, 4, 4), (1, 0, 5, 5),
                                                           (1, 1, 6, 6), (1, 2, 6, 6))]
    gen = lambda q, answers: [{"question": q, "chain": c, "answer": truth, "g_answer": a, "g_correct": a == truth,  # noqa: E731
                               "final_answer": a, "correct": a == truth} for c, a in enumerate(answers)]
    rows = {"dpo": dpo_rows, "dpo_generator": malt_eval.generator_alone(dpo_rows), "single": gen(0, [4, 4, 5]) + gen(1, [4, 5, 5]),
            "base": gen(0, [4, 4, 4]) + gen(1, [4, 4, 4]), "base_greedy": gen(0, [4]) + gen(1, [4]),
            "untrained": gen(0, [4]) + gen(1, [4]), "sft": gen(0, [4]) + gen(1, [4]), "dpo_local": gen(0, [4]) + gen(1, [4])}
    records = malt_eval.records_by_arm([[{"arm": a, "healthy": True, "failed_checks": []} for a in malt_eval.ARM_VARIANTS]])
    d = malt_eval.paired_differences(rows, 3, records, n_boot=200, seed=0)
    assert d["MALT vs its generator alone (single)"]["diff"] == pytest.approx(0.5)     # q0: 4 -> 5 fixed; q1: 5 kept
    assert d["MALT vs single-agent control (single)"]["diff"] == pytest.approx(1.0)    # the control's first chains: 4, 4
    assert d["MALT vote vs single-agent control vote (3)"]["diff"] == pytest.approx(0.0)  # votes: q0 5 vs 4, q1 6 vs 5
    assert d["MALT's generator alone vs single-agent control (single)"]["diff"] == pytest.approx(0.5)
    acc = malt_eval.accuracy_summary(rows, 3, n_boot=200, seed=0)
    assert acc["MALT's generator alone"]["acc"] == 0.5 and acc["single-agent control, vote of 3"]["acc"] == 0.5
