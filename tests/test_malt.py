"""MALT pieces against hand-worked trees: value iteration, pooling, pairs, voting, adapters, DPO reference,
and notebook 05's held-out protocol (accuracies, paired differences, answer changes) through replication.core.stats."""
import math

import numpy as np
import pytest
import torch

from replication.core import cache, config, stats
from replication.lm import dpo, models, tasks
from replication.lm.arms import RECORD_KEYS
from replication.papers.malt import malt, malt_eval, malt_training

# One question, n = 2: leaves under (g0, v00), (g0, v01), (g1, v10), (g1, v11).
REWARD_N2 = np.array([[[[1, 0], [1, 1]], [[0, 0], [0, 1]]]])


def hand_tree():
    """The n = 2 tree above with named texts, as sample_trees returns it."""
    g = ["g0", "g1"]
    v = ["v00", "v01", "v10", "v11"]
    r = [f"r{j}{k}{l}" for j in range(2) for k in range(2) for l in range(2)]
    return {"n": 2, "questions": ["Q?"], "answers": [7], "g": g, "v": v, "r": r,
            "reward": REWARD_N2.ravel().tolist()}


def test_value_iteration_by_hand():
    v_g, v_v, v_r = malt.value_iteration(REWARD_N2)
    np.testing.assert_allclose(v_v, [[[0.5, 1.0], [0.0, 0.5]]])
    np.testing.assert_allclose(v_g, [[0.75, 0.25]])
    np.testing.assert_array_equal(v_r, REWARD_N2)


def test_binarise_is_strict_at_half():
    np.testing.assert_array_equal(malt.binarise([0.0, 0.5, 0.5001, 1.0]), [False, False, True, True])


def test_all_correct_and_all_wrong_subtrees():
    reward = np.zeros((2, 3, 3, 3))
    reward[0] = 1                                       # question 0: every leaf right, question 1: every leaf wrong
    v_g, v_v, _ = malt.value_iteration(reward)
    np.testing.assert_array_equal(v_g, [[1, 1, 1], [0, 0, 0]])
    for pooling in malt.POOLINGS:
        lab_g, lab_v, lab_r = malt.labels(reward, pooling)
        assert lab_g[0].all() and not lab_g[1].any() and lab_v[0].all() and not lab_v[1].any()
        assert all(malt.sibling_pairs(lab) == [] for lab in (lab_g, lab_v, lab_r))


def test_branching_one_is_the_chain_itself():
    reward = np.array([1, 0, 1]).reshape(3, 1, 1, 1)
    v_g, v_v, v_r = malt.value_iteration(reward)
    np.testing.assert_array_equal(v_g.ravel(), [1, 0, 1])
    np.testing.assert_array_equal(v_v.ravel(), [1, 0, 1])
    assert all(malt.sibling_pairs(lab) == [] for lab in malt.labels(reward))  # one child: no siblings


def test_global_and_local_pooling_differ_where_worked_out():
    # g0: critiques worth 1/3, 1/3, 1 -> V = 5/9 > 0.5 (global +), but 1 of 3 critiques positive (local -)
    # g1: critiques worth 2/3, 2/3, 0 -> V = 4/9 (global -), but 2 of 3 critiques positive (local +)
    # g2: all 1 -> both +
    reward = np.zeros((1, 3, 3, 3))
    reward[0, 0, 0, 0] = reward[0, 0, 1, 0] = 1
    reward[0, 0, 2] = 1
    reward[0, 1, 0, :2] = reward[0, 1, 1, :2] = 1
    reward[0, 2] = 1
    np.testing.assert_allclose(malt.value_iteration(reward)[0], [[5 / 9, 4 / 9, 1]])
    np.testing.assert_array_equal(malt.labels(reward, "global")[0], [[True, False, True]])
    np.testing.assert_array_equal(malt.labels(reward, "local")[0], [[False, True, True]])
    agree = malt.pooling_agreement(reward)
    assert agree == {"generator": pytest.approx(1 / 3), "verifier": 1.0}


def test_preference_pairs_by_hand():
    tree = hand_tree()
    pairs = malt.preference_pairs(tree, "global")
    rp = malt.refiner_prompt
    # refiner: siblings under (g0, v00): r000 (1) vs r001 (0); under (g1, v11): r111 (1) vs r110 (0)
    assert pairs["refiner"] == [(rp("Q?", "g0", "v00"), "r000", "r001"), (rp("Q?", "g1", "v11"), "r111", "r110")]
    # verifier values: g0 -> (0.5, 1): v01 positive, v00 negative (0.5 is not > 0.5); g1 -> (0, 0.5): no positive
    assert pairs["verifier"] == [(malt.verifier_prompt("Q?", "g0"), "v01", "v00")]
    # generator values 0.75 and 0.25
    assert pairs["generator"] == [(malt.generator_prompt("Q?"), "g0", "g1")]
    # local pooling: g0's critiques are (-, +): no majority, so g0 is negative too and D_G is empty
    assert malt.preference_pairs(tree, "local")["generator"] == []


def test_sft_examples_are_the_positive_nodes():
    sft = malt.sft_examples(hand_tree())
    assert [c for _, c in sft["generator"]] == ["g0"]
    assert [c for _, c in sft["verifier"]] == ["v01"]
    assert [c for _, c in sft["refiner"]] == ["r000", "r010", "r011", "r111"]
    assert sft["refiner"][3][0] == malt.refiner_prompt("Q?", "g1", "v11")


def test_pair_counts_are_positive_times_negative_per_parent():
    rng = np.random.default_rng(0)
    reward = rng.integers(0, 2, size=(4, 3, 3, 3))
    for lab in malt.labels(reward):
        expected = sum(int(row.sum()) * int((~row).sum()) for row in lab.reshape(-1, lab.shape[-1]))
        assert len(malt.sibling_pairs(lab)) == expected


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="pooling"):
        malt.labels(REWARD_N2, "median")
    with pytest.raises(ValueError, match="reward"):
        malt.value_iteration(np.full((1, 2, 2, 2), 0.5))
    with pytest.raises(ValueError, match="role"):
        with malt.use_role(None, "critic"):
            pass


def test_majority_vote_and_ties():
    assert malt.majority_vote([3, 5, 5]) == 5
    assert malt.majority_vote([3, 5, 7]) == 3           # three-way tie: the first chain's answer
    assert malt.majority_vote([None, 4, 2]) == 4        # missing answers do not vote
    assert malt.majority_vote([2, None, 2]) == 2
    assert malt.majority_vote([None, None]) is None


def test_vote_accuracy_and_flips():
    rows = [
        {"question": 0, "chain": 0, "answer": 5, "final_answer": 5, "g_correct": False, "correct": True},
        {"question": 0, "chain": 1, "answer": 5, "final_answer": 4, "g_correct": True, "correct": False},
        {"question": 0, "chain": 2, "answer": 5, "final_answer": 5, "g_correct": True, "correct": True},
        {"question": 1, "chain": 0, "answer": 9, "final_answer": None, "g_correct": False, "correct": False},
        {"question": 1, "chain": 1, "answer": 9, "final_answer": 8, "g_correct": False, "correct": False},
        {"question": 1, "chain": 2, "answer": 9, "final_answer": 9, "g_correct": False, "correct": True},
    ]
    assert malt_eval.vote_accuracy(rows) == (1, 2)          # question 1: tie 8 vs 9, the earlier chain (8) wins
    assert malt_eval.flips(rows) == {"wrong_to_right": 2, "right_to_wrong": 1, "right_to_right": 1, "wrong_to_wrong": 2}


def test_subsample_is_seeded_and_ordered():
    items = list(range(50))
    a, b = malt.subsample(items, 10, seed=3), malt.subsample(items, 10, seed=3)
    assert a == b and a == sorted(a) and len(set(a)) == 10
    assert malt.subsample(items[:5], 10) == items[:5]


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_adapter_switching_between_roles():
    base, tok = models.tiny_model(seed=1)
    ids = torch.tensor([tok("hello there", add_special_tokens=False)["input_ids"]])
    before = _logits(base, ids).clone()
    model = malt_training.add_role_adapters(base, r=4, alpha=8)
    assert set(model.peft_config) == set(malt.ROLES)
    with torch.no_grad():                               # give each role its own non-zero LoRA B
        for i, role in enumerate(malt.ROLES):
            for name, p in model.named_parameters():
                if f"lora_B.{role}." in name:
                    p.fill_(0.05 * (i + 1))
    out = {}
    for role in malt.ROLES:
        with malt.use_role(model, role):
            out[role] = _logits(model, ids)
            assert model.active_adapter == role
    with malt.use_role(model, None):
        torch.testing.assert_close(_logits(model, ids), before)
    assert not torch.allclose(out["generator"], out["verifier"])
    assert not torch.allclose(out["verifier"], out["refiner"])
    assert not torch.allclose(out["generator"], before)
    saved = malt_training.adapter_state(model, "verifier")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B.verifier." in name:
                p.zero_()
    malt_training.load_adapter_state(model, "verifier", saved)
    with malt.use_role(model, "verifier"):
        torch.testing.assert_close(_logits(model, ids), out["verifier"])


def _tiny_roles(seed=0):
    model, tok = models.tiny_model(seed=seed)
    return malt_training.add_role_adapters(model, r=8, alpha=16), tok


PAIRS = [("say a", "aaaa", "zzzz"), ("say b", "abab", "zyzy"), ("go", "aaba", "zzyz"), ("hi", "baaa", "yzzz")]


def test_dpo_with_sft_reference_starts_at_log2_and_learns():
    model, tok = _tiny_roles()
    cfg = dpo.PreferenceConfig(lr=5e-3, epochs=1, batch_size=4, dpo_beta=0.5, seed=0)
    dpo.train_sft(model, tok, [(p, c) for p, c, _ in PAIRS], cfg, adapter_name="refiner", progress=False)
    sft_state = malt_training.adapter_state(model, "refiner")
    rows = malt_training.train_dpo_sft_reference(model, tok, PAIRS * 4, dpo.PreferenceConfig(
        lr=5e-3, epochs=3, batch_size=4, dpo_beta=0.5, seed=0), "refiner")
    # reference = the SFT adapter itself, so the first margin is 0 and the loss is log 2 exactly
    assert rows[0]["margin"] == pytest.approx(0.0, abs=1e-4)
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert rows[-1]["margin"] > 1.0 and rows[-1]["accuracy"] == 1.0
    # the base-reference path (dpo.train_dpo) starts away from 0 after SFT moved the adapter
    malt_training.load_adapter_state(model, "refiner", sft_state)
    logs = malt_training.train_role(model, tok, "refiner", [], PAIRS, cfg, cfg, reference="base", stage="dpo")
    assert logs["sft"] == [] and abs(logs["dpo"][0]["margin"]) > 1e-3


def test_train_role_touches_only_its_adapter():
    model, tok = _tiny_roles()
    before = {r: malt_training.adapter_state(model, r) for r in malt.ROLES}
    cfg = dpo.PreferenceConfig(lr=1e-2, epochs=1, batch_size=2, dpo_beta=0.1, seed=0)
    logs = malt_training.train_role(model, tok, "verifier", [(p, c) for p, c, _ in PAIRS], PAIRS, cfg, cfg)
    assert len(logs["sft"]) == 2 and len(logs["dpo"]) == 2
    after = {r: malt_training.adapter_state(model, r) for r in malt.ROLES}
    changed = {r: any(not torch.equal(before[r][k], after[r][k]) for k in before[r]) for r in malt.ROLES}
    assert changed == {"generator": False, "verifier": True, "refiner": False}
    with pytest.raises(ValueError, match="reference"):
        malt_training.train_role(model, tok, "verifier", [], PAIRS, cfg, cfg, reference="ema")


def test_sample_trees_and_chains_shapes():
    model, tok = _tiny_roles()
    problems = tasks.make_level("1d-1step-add", 2, seed=0)
    tree = malt.sample_trees(model, tok, problems, n=2, tokens=(4, 3, 4), temperature=1.0, seed=0, batch_size=8)
    assert len(tree["g"]) == 4 and len(tree["v"]) == 8 and len(tree["r"]) == 16
    assert set(tree["reward"]) <= {0, 1} and malt.rewards(tree).shape == (2, 2, 2, 2)
    again = malt.sample_trees(model, tok, problems, n=2, tokens=(4, 3, 4), temperature=1.0, seed=0, batch_size=8)
    assert again == tree                                # seeded
    rows = malt.run_chains(model, tok, problems, k=3, trained=True, tokens=(4, 3, 4), seed=0)
    assert len(rows) == 6 and [r["chain"] for r in rows[:3]] == [0, 1, 2]
    g_only = malt.run_chains(model, tok, problems, k=2, generator_only=True, tokens=(4, 3, 4), seed=0)
    assert all(r["v"] is None and r["correct"] == r["g_correct"] for r in g_only)
    with pytest.raises(ValueError, match="tokens"):
        malt.sample_trees(model, tok, problems, tokens=(4, 4))


def test_refiner_sees_its_first_answer_as_its_own_turn():
    turns = malt.refiner_prompt("Q?", "g text", "v text")
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[0]["content"] == malt.generator_prompt("Q?") and turns[1]["content"] == "g text"
    assert "v text" in turns[2]["content"] and "The answer is <number>" in turns[2]["content"]
    assert malt.prompt_key()[2][1]["content"] == "{g}"


def test_chains_can_continue_given_first_answers():
    model, tok = _tiny_roles()
    problems = tasks.make_level("1d-1step-add", 2, seed=0)
    given = [f"The answer is {p.answer}." for p in problems]
    rows = malt.run_chains(model, tok, problems, k=1, g=given, tokens=(4, 3, 4), seed=0)
    assert [r["g"] for r in rows] == given and all(r["g_correct"] for r in rows)
    assert all(isinstance(r["r"], str) for r in rows)
    with pytest.raises(ValueError, match="g has 1 replies"):
        malt.run_chains(model, tok, problems, k=1, g=given[:1], tokens=(4, 3, 4))


def test_reply_stats_by_hand():
    rows = [{"g": "3", "r": "so 5. The answer is 5.", "answer": 5, "correct": True, "final_answer": 5, "g_answer": 3},
            {"g": "2 and 5", "r": None, "answer": 5, "correct": True, "final_answer": 5, "g_answer": 5}]
    out = malt_eval.reply_stats(rows)
    assert out == {"chains": 2, "accuracy": 1.0, "accuracy_strict": 0.5, "format_rate": 0.5,
                   "kept_generator_answer": 0.5, "mean_chars": (len("so 5. The answer is 5.") + len("2 and 5")) / 2}


def test_generator_instruction_is_its_own_name():
    assert malt.generator_prompt("Q?") == f"Q?\n{malt.GENERATOR_INSTRUCTION}"
    assert malt.GENERATOR_INSTRUCTION != tasks.INSTRUCTION and not hasattr(malt, "INSTRUCTION")


def test_generate_accepts_derived_seeds():
    model, tok = models.tiny_model(seed=0)
    seed = config.derive_seed(0, "tree", "verifier")
    assert seed > 2**32  # a full derived seed: models.generate derives its per-batch seeds from it
    a = models.generate(model, tok, ["a", "b"], max_new_tokens=4, temperature=1.0, seed=seed, batch_size=1)
    assert a.texts == models.generate(model, tok, ["a", "b"], max_new_tokens=4, temperature=1.0, seed=seed, batch_size=1).texts


def test_construction_holds_on_the_hand_tree_and_fails_off_it():
    tree = hand_tree()                                         # n = 2
    assert malt.construction_holds(tree, 2, 8, 0.5)
    assert not malt.construction_holds(tree, 3, 27, 0.5)      # the paper samples 3 per role, this tree 2
    assert not malt.construction_holds(tree, 2, 9, 0.5)       # the paper's own arithmetic: 2^3 = 8
    assert not malt.construction_holds(tree, 2, 8, 0.4)       # a different threshold than the one labels use
    assert not malt.construction_holds({**tree, "r": tree["r"][:-1]}, 2, 8, 0.5)


def chains(question, outcomes, answer=5):
    """Rows as run_chains gives them: (g_correct, correct, final answer) per chain; the first answer is the true
    answer when right, else answer + 1."""
    return [{"question": question, "chain": c, "answer": answer, "g_correct": g, "correct": ok, "final_answer": a,
             "g_answer": answer if g else answer + 1} for c, (g, ok, a) in enumerate(outcomes)]


ROWS = {  # two questions (answer 5), three chains each; single-chain variants have chain 0 only
    "dpo": chains(0, [(0, 1, 5), (1, 1, 5), (0, 0, 4)]) + chains(1, [(1, 0, 3), (0, 1, 5), (0, 1, 5)]),
    "base": chains(0, [(0, 0, 4), (1, 1, 5), (0, 0, 6)]) + chains(1, [(1, 1, 5), (0, 0, 3), (0, 0, 3)]),
    "base_greedy": chains(0, [(1, 1, 5)]) + chains(1, [(0, 0, 2)]),
    "untrained": chains(0, [(0, 0, 4)]) + chains(1, [(1, 1, 5)]),
    "sft": chains(0, [(0, 1, 5)]) + chains(1, [(0, 0, 1)]),
    "dpo_local": chains(0, [(0, 0, 4)]) + chains(1, [(0, 0, 1)]),
    "single": chains(0, [(1, 1, 5), (0, 0, 6), (0, 0, 6)]) + chains(1, [(1, 1, 5), (1, 1, 5), (0, 0, 6)]),
}
ROWS["dpo_generator"] = malt_eval.generator_alone(ROWS["dpo"])   # first answers: q0 wrong, right, wrong; q1 right, wrong, wrong


def test_per_question_first_chain_and_vote():
    np.testing.assert_array_equal(malt_eval.per_question(ROWS["dpo"]), [1, 0])
    np.testing.assert_array_equal(malt_eval.per_question(ROWS["dpo"], vote=True), [1, 1])
    np.testing.assert_array_equal(malt_eval.per_question(ROWS["base"], vote=True), [0, 0])  # 4/5/6 tie: the first (4)


def test_accuracy_summary_uses_wilson_intervals():
    acc = malt_eval.accuracy_summary(ROWS, votes=3)
    assert list(acc) == ["base generator (greedy)", "base generator", "base generator, vote of 3", "untrained G-V-R",
                         "after SFT", "after SFT + DPO (MALT)", "MALT, vote of 3", "MALT, local pooling",
                         "MALT's generator alone", "MALT's generator alone, vote of 3", "single-agent control",
                         "single-agent control, vote of 3"]
    p, lo, hi = stats.proportion_ci(2, 2)
    assert acc["MALT, vote of 3"] == {"acc": p, "ci95": [lo, hi], "n": 2, "seeds": 1, "per_seed": [1.0], "trained": True}
    assert acc["base generator"]["acc"] == 0.5 and acc["after SFT"]["acc"] == 0.5
    assert not acc["base generator"]["trained"] and acc["after SFT"]["trained"]


def other_seed(rows):
    """A second training seed: the trained variants' chains of their own (here every answer wrong), the base
    generator's and the untrained chain's the same objects (they are drawn once)."""
    return {k: ([{**r, "correct": 0, "final_answer": 9} for r in v] if k in malt_eval.TRAINED else v) for k, v in rows.items()}


SEEDS = [ROWS, other_seed(ROWS)]


def test_accuracy_over_seeds_is_two_level_for_trained_variants_and_wilson_for_the_rest():
    acc = malt_eval.accuracy_summary(SEEDS, votes=3, n_boot=300, seed=2)
    hits = np.array([[1.0, 1.0], [0.0, 0.0]])                         # MALT vote: seed 0 both right, seed 1 none
    assert acc["MALT, vote of 3"] == {"acc": 0.5, "ci95": list(stats.two_level_bootstrap(hits, 300, 2, bounds=(0, 1))[1:]), "n": 2,
                                      "seeds": 2, "per_seed": [1.0, 0.0], "trained": True}
    p, lo, hi = stats.proportion_ci(1, 2)                                  # the base generator: one run, Wilson
    assert acc["base generator"] == {"acc": p, "ci95": [lo, hi], "n": 2, "seeds": 1, "per_seed": [0.5], "trained": False}
    np.testing.assert_array_equal(malt_eval.outcomes(SEEDS, "dpo"), [[1, 0], [0, 0]])
    assert malt_eval.outcomes(SEEDS, "base").shape == (1, 2) and len(malt_eval.seed_chains(SEEDS, "untrained")) == 1


def healthy_records(seeds=1, failed=()):
    """records_by_arm of healthy arms over `seeds` training seeds; the arms in `failed` fail 'learned' in seed 0."""
    recs = [[{"arm": a, "healthy": not (i == 0 and a in failed), "failed_checks": ["learned"] if i == 0 and a in failed else []}
             for a in malt_eval.ARM_VARIANTS] for i in range(seeds)]
    return malt_eval.records_by_arm(recs)


def test_paired_differences_come_from_the_two_level_bootstrap():
    diffs = malt_eval.paired_differences(ROWS, votes=3, records=healthy_records(), n_boot=300, seed=4)
    d = diffs["MALT vote vs base vote (3)"]
    expected = stats.two_level_bootstrap([[1.0, 1.0]], n_boot=300, seed=4, bounds=(-1, 1))
    assert (d["diff"], *d["ci95"]) == expected and d["n"] == "1 seed x 2 questions" and np.isnan(d["relative"])
    assert d["per_seed"] == [1.0] and d["basis"] == {"interval": list(expected[1:]), "estimate": 1.0, "seed_differences": [1.0],
                                                     "health": None}
    single = diffs["MALT vs base generator (single)"]
    assert single["diff"] == 0.0 and single["relative"] == 0.0
    assert diffs["SFT + DPO vs SFT (single)"]["relative"] == pytest.approx(0.0)
    assert diffs["global vs local pooling (single)"]["diff"] == pytest.approx(0.5)   # dpo [1, 0] vs local [0, 0]


def test_paired_differences_pair_every_seed_with_the_shared_base_and_name_a_failed_health_check():
    records = healthy_records(2, failed=("MALT (global pooling)",))
    diffs = malt_eval.paired_differences(SEEDS, votes=3, records=records, n_boot=300, seed=4)
    d = diffs["MALT vs base generator (single)"]            # MALT [1, 0] then [0, 0]; the base [0, 1] in both
    expected = stats.two_level_bootstrap([[1.0, -1.0], [0.0, -1.0]], n_boot=300, seed=4, bounds=(-1, 1))
    assert (d["diff"], *d["ci95"]) == expected and d["n"] == "2 seeds x 2 questions"
    assert d["per_seed"] == [0.0, -0.5] and d["probability_of_improvement"] == 0.25
    assert d["basis"]["seed_differences"] == [0.0, -0.5] and "interval" in d["basis"] and "not_tested" not in d["basis"]
    assert d["basis"]["health"] == "failed health check: MALT (global pooling) seed 0 (learned)"
    assert d["relative"] == pytest.approx(0.25 / 0.5 - 1)
    untrained = diffs["untrained G-V-R vs base generator (single)"]   # neither trains: one table each
    assert untrained["n"] == "1 seed x 2 questions" and untrained["basis"]["health"] is None


def test_flip_table_counts_and_change_with_no_test_that_pools_chains():
    out = malt_eval.flip_table(ROWS, ["dpo"], n_boot=300, seed=0)["dpo"]
    assert {k: out[k] for k in ("wrong_to_right", "right_to_wrong", "right_to_right", "wrong_to_wrong")} == \
        malt_eval.flips(ROWS["dpo"]) == {"wrong_to_right": 3, "right_to_wrong": 1, "right_to_right": 1, "wrong_to_wrong": 1}
    assert not any("p" == k.split("_")[-1] or "mcnemar" in k for k in out)   # the seed is the unit: no p over chains
    assert out["change"] == pytest.approx(2 / 6) and out["chains"] == 6 and out["questions"] == 2
    assert out["ci95"][0] <= out["change"] <= out["ci95"][1] and out["n"] == "1 seed x 2 questions"


def test_flip_table_over_seeds_sums_counts_and_bootstraps_seeds_then_questions():
    out = malt_eval.flip_table(SEEDS, ["dpo", "untrained"], n_boot=300, seed=0)
    dpo = out["dpo"]                                   # seed 1: every final answer wrong
    assert dpo["chains"] == 12 and dpo["seeds"] == 2 and dpo["n"] == "2 seeds x 2 questions"
    assert dpo["wrong_to_right"] == 3 and dpo["right_to_wrong"] == 1 + 2
    change = [[1 / 3, 1 / 3], [-1 / 3, -1 / 3]]        # seed 1: q0 has one right first answer of 3, q1 one of 3
    assert dpo["per_seed"] == pytest.approx([1 / 3, -1 / 3])
    assert (dpo["change"], *dpo["ci95"]) == pytest.approx(stats.two_level_bootstrap(change, n_boot=300, seed=0))
    assert out["untrained"]["chains"] == 2 and out["untrained"]["seeds"] == 1      # drawn once


def test_variant_chains_go_through_the_given_cache(tmp_path):
    model, tok = _tiny_roles()
    problems = tasks.make_level("1d-1step-add", 2, seed=0)
    seen = []

    def cache_fn(name, key, make):
        seen.append((name, key))
        return cache.cached(tmp_path, name, key, make)

    given = ["The answer is 1.", "The answer is 2."]
    kw = dict(tokens=(4, 3, 4), temperature=1.0, seed=0, batch_size=8)
    rows = malt_eval.variant_chains(cache_fn, {"base": 1}, "untrained", model, tok, problems, k=1, g=given, **kw)
    assert seen == [("eval-untrained", {"base": 1, "variant": "untrained", "k": 1, **kw})]   # g is not in the key
    again = malt_eval.variant_chains(cache_fn, {"base": 1}, "untrained", model, tok, problems, k=1, g=given, **kw)
    assert again == rows and [r["g"] for r in rows] == given


def test_trained_stage_survives_the_cache(tmp_path):
    model, tok = _tiny_roles()
    cfg = dpo.PreferenceConfig(lr=1e-2, epochs=1, batch_size=2, dpo_beta=0.1, seed=0)
    sets = {r: [(p, c) for p, c, _ in PAIRS] for r in malt.ROLES}
    pairs = {r: PAIRS for r in malt.ROLES}

    def make():
        return malt_training.train_stage(model, tok, sets, pairs, cfg, cfg, "sft", "sft")

    first = cache.cached(tmp_path, "sft", {"k": 1}, make)
    trained = {r: malt_training.adapter_state(model, r) for r in malt.ROLES}
    assert all(len(first["logs"][r]["sft"]) == 2 and first["logs"][r]["dpo"] == [] for r in malt.ROLES)
    fresh, _ = _tiny_roles()
    for value in (first, cache.cached(tmp_path, "sft", {"k": 1}, make)):   # as made, then as reloaded
        malt_training.load_stage(fresh, value)
        for r in malt.ROLES:
            state = malt_training.adapter_state(fresh, r)
            assert all(torch.equal(state[k], trained[r][k]) for k in state)


def test_trainers_with_nothing_to_train_return_no_rows():
    model, tok = _tiny_roles()
    cfg = dpo.PreferenceConfig()
    assert dpo.train_sft(model, tok, [], cfg, adapter_name="generator", progress=False) == []
    assert dpo.train_dpo(model, tok, [], cfg, adapter_name="generator", progress=False) == []


# ---- the rebuilt protocol: worked examples, validation trees, equal budgets, held-out epochs, health ----------

def test_generator_prompt_with_worked_examples_and_the_refiner_conversation():
    shots = tasks.worked_examples("2d-1step-add", 2, seed=0)
    turns = malt.generator_prompt("Q?", shots)
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert turns[1]["content"] == shots[0].solution and turns[-1]["content"] == f"Q?\n{malt.GENERATOR_INSTRUCTION}"
    assert malt.generator_prompt("Q?") == f"Q?\n{malt.GENERATOR_INSTRUCTION}"       # no shots: the plain message
    conv = malt.refiner_prompt("Q?", "g", "v", shots)
    assert conv[:5] == turns and conv[5] == {"role": "assistant", "content": "g"} and "v" in conv[6]["content"]
    assert malt.prompt_key(shots) != malt.prompt_key()


def test_tree_keeps_its_worked_examples_for_the_training_prompts():
    shots = tasks.worked_examples("1d-1step-add", 1, seed=0)
    tree = {**hand_tree(), "shots": [s.to_dict() for s in shots]}
    prompt, chosen, rejected = malt.preference_pairs(tree)["generator"][0]
    assert prompt == malt.generator_prompt("Q?", shots) and (chosen, rejected) == ("g0", "g1")
    assert malt.sft_examples(tree)["refiner"][0][0] == malt.refiner_prompt("Q?", "g0", "v00", shots)


def test_tree_subset_picks_whole_trees():
    two = {"n": 2, "questions": ["A", "B"], "answers": [1, 2], "g": ["a0", "a1", "b0", "b1"],
           "v": [f"{q}v{i}" for q in "ab" for i in range(4)], "r": [f"{q}r{i}" for q in "ab" for i in range(8)],
           "reward": [0] * 8 + [1] * 8}
    sub = malt.tree_subset(two, [1])
    assert sub["questions"] == ["B"] and sub["answers"] == [2] and sub["g"] == ["b0", "b1"]
    assert sub["v"] == [f"bv{i}" for i in range(4)] and sub["r"] == [f"br{i}" for i in range(8)]
    assert sub["reward"] == [1] * 8 and malt.rewards(sub).shape == (1, 2, 2, 2)


def test_equal_budget_gives_every_pooling_the_same_count_per_role():
    by = {"global": {"generator": list(range(3)), "verifier": list(range(10)), "refiner": list(range(50))},
          "local": {"generator": list(range(7)), "verifier": list(range(4)), "refiner": list(range(60))}}
    out = malt.equal_budget(by, limit=20, seed=1)
    assert {r: len(out["global"][r]) for r in malt.ROLES} == {"generator": 3, "verifier": 4, "refiner": 20}
    assert all(len(out["global"][r]) == len(out["local"][r]) for r in malt.ROLES)
    assert set(out["local"]["refiner"]) <= set(range(60)) and out == malt.equal_budget(by, limit=20, seed=1)
    by["local"]["generator"] = []                     # one pooling has none: neither trains that role
    assert malt.equal_budget(by, limit=20, seed=1)["global"]["generator"] == []


def test_held_out_check_keeps_the_best_epoch():
    examples = [(p, c) for p, c, _ in PAIRS]
    model, tok = _tiny_roles()
    before = malt_training.adapter_state(model, "generator")
    frozen = dpo.PreferenceConfig(lr=0.0, epochs=2, batch_size=2, seed=0)
    rows = dpo.train_sft(model, tok, examples, frozen, adapter_name="generator", progress=False, validation=examples)
    assert rows[-1]["best_epoch"] == 0 and len(rows[-1]["val_curve"]) == 3     # nothing learned: epoch 0 kept
    after = malt_training.adapter_state(model, "generator")
    assert all(torch.equal(before[k], after[k]) for k in before)
    learn = dpo.PreferenceConfig(lr=5e-3, epochs=3, batch_size=2, seed=0)
    rows = dpo.train_sft(model, tok, examples, learn, adapter_name="generator", progress=False, validation=examples)
    curve = rows[-1]["val_curve"]
    assert rows[-1]["best_epoch"] == int(np.argmin(curve)) > 0 and min(curve) < curve[0]
    assert "val_loss" in rows[1] and rows[1]["val_loss"] == pytest.approx(curve[1])   # 2 steps per epoch
    assert dpo.sft_validation_loss(model, tok, examples, learn) == pytest.approx(min(curve), abs=1e-5)


def test_dpo_held_out_check_starts_at_log2_against_the_sft_reference():
    model, tok = _tiny_roles()
    cfg = dpo.PreferenceConfig(lr=5e-3, epochs=2, batch_size=4, dpo_beta=0.5, seed=0)
    rows = dpo.train_dpo(model, tok, PAIRS, cfg, "verifier", progress=False, reference="initial", validation=PAIRS)
    curve = rows[-1]["val_curve"]
    assert curve[0] == pytest.approx(math.log(2), abs=1e-5) and min(curve) < curve[0] and rows[-1]["best_epoch"] > 0


def _logs(curves):
    return {r: {"sft": [{"loss": 1.0, "val_curve": c}] if c else [], "dpo": [{"loss": 0.7, "val_curve": c}] if c else []}
            for r, c in zip(malt.ROLES, curves)}


def _with_text(rows, text):
    return [{**r, "g": text, "r": text} for r in rows]


def chars(texts, add_special_tokens=False):
    """A tokenizer stand-in whose tokens are characters (arms.token_lengths)."""
    return {"input_ids": [list(t) for t in texts]}


def test_health_checks_learning_accuracy_and_length():
    base = _with_text(ROWS["base"], "x" * 20)
    good = malt_eval.health(_with_text(ROWS["dpo"], "y" * 20), base, _logs([[1.0, 0.8], None, [0.7, 0.9]]), "dpo", chars)
    assert good["healthy"] and good["signal"]["by_role"] == {"generator": pytest.approx(0.2), "refiner": 0.0}
    still = malt_eval.health(_with_text(ROWS["dpo"], "y" * 20), base, _logs([[1.0, 1.2], [0.5], None]), "dpo", chars)
    assert still["failed"] == ["learned"]
    short = malt_eval.health(_with_text(ROWS["dpo"], "y" * 5), base, _logs([[1.0, 0.8], None, None]), "sft", chars)
    assert short["failed"] == ["length_ok"] and short["heldout_length_ratio"] == pytest.approx(0.25)
    worse = malt_eval.health(_with_text(ROWS["dpo_local"], "y" * 20), _with_text(ROWS["sft"], "x" * 20),
                             _logs([[1.0, 0.8], None, None]), "dpo", chars)       # 0 of 2 right vs a base of 1 of 2
    assert worse["failed"] == ["accuracy_ok"] and worse["base_accuracy_low"] == stats.proportion_ci(1, 2)[1] > 0


def test_arm_records_and_comparison_basis():
    rows = {k: _with_text(v, "z" * 10) for k, v in ROWS.items()}
    logs = _logs([[1.0, 0.8], [1.0, 0.9], [1.0, 0.95]])
    sets = {p: ({r: ["s"] * 2 for r in malt.ROLES}, {r: ["p"] * 3 for r in malt.ROLES}) for p in malt.POOLINGS}
    own_logs = _logs([[1.0, 0.9], None, None])                    # the control trains the generator only
    own = ({"generator": ["s"] * 2, "verifier": [], "refiner": []}, {"generator": ["p"] * 3, "verifier": [], "refiner": []})
    arms = malt_eval.arm_records(rows, {"sft": (logs, sets["global"], malt.ROLES, "global"),
                                        "dpo": (logs, sets["global"], malt.ROLES, "global"),
                                        "dpo_local": (logs, sets["local"], malt.ROLES, "local"),
                                        "dpo_generator": (logs, sets["global"], ("generator",), "global"),
                                        "single": (own_logs, own, ("generator",), "own answer")}, chars)
    by = {a["arm"]: a for a in arms}
    assert list(by) == list(malt_eval.ARM_VARIANTS)
    assert all(set(RECORD_KEYS) <= set(a) for a in arms)
    assert by["base generator"]["steps"] == 0 and by["base generator"]["samples"] == 0
    assert by["after SFT"]["steps"] == 3 and by["after SFT"]["samples"] == 6
    assert by["MALT (global pooling)"]["steps"] == 6 and by["MALT (global pooling)"]["samples"] == 15
    # the generator alone counts the generator's data: as many as the control's, which trained nothing else
    assert by["MALT's generator alone"]["samples"] == by["single-agent control"]["samples"] == 5
    assert by["MALT's generator alone"]["steps"] == by["single-agent control"]["steps"] == 2
    assert by["single-agent control"]["labels"] == "own answer" and by["MALT (local pooling)"]["labels"] == "local"
    assert by["single-agent control"]["health"]["signal"]["by_role"] == {"generator": pytest.approx(0.1)}
    d = {"ci95": [0.1, 0.3]}
    assert malt_eval.comparison_basis(d, ["MALT (global pooling)"], arms) == {"interval": (0.1, 0.3), "health": None}
    failed = [{**a, "healthy": False, "failed_checks": ["learned"]} if a["arm"] == "after SFT" else a for a in arms]
    basis = malt_eval.comparison_basis({**d, "diff": 0.2, "per_seed": [0.2]}, ["MALT (global pooling)", "after SFT"], failed)
    assert basis == {"interval": (0.1, 0.3), "estimate": 0.2, "seed_differences": [0.2],
                     "health": "failed health check: after SFT (learned)"}     # measured, the failed check beside it
    by_arm = malt_eval.records_by_arm([arms, failed])                            # two training seeds
    assert by_arm["base generator"] is arms[0] and by_arm["after SFT"] == [arms[2], failed[2]]
    basis = malt_eval.comparison_basis(d, ["MALT (global pooling)", "after SFT"], by_arm)
    assert basis["health"] == "failed health check: after SFT seed 1 (learned)" and basis["interval"] == (0.1, 0.3)
    frame = malt_eval.records_frame(by_arm, [0, 1])
    assert list(frame.index) == [("base generator", "-"), ("untrained G-V-R", "-")] + [
        (a, s) for a in ("after SFT", "MALT (global pooling)", "MALT (local pooling)", "MALT's generator alone",
                         "single-agent control") for s in (0, 1)]
    assert frame.loc[("after SFT", 1), "failed_checks"] == ["learned"]


def test_sampling_copy_names_its_parameter():
    model, _ = _tiny_roles()
    assert malt.sampling_copy(model, "float32") is None
    with pytest.raises(ValueError, match="rollout_dtype"):
        malt.sampling_copy(model, "float16")


def test_sft_and_dpo_log_probs_encode_each_prompt_once_with_the_plain_values_and_gradient():
    """dpo._seq_logps (SFT and DPO batches: every DPO prompt twice, MALT's prompts led by the same worked examples)
    encodes each distinct prompt once and the shared leading run once: the per-token log-probs and the LoRA
    gradient of the summed log-probs equal one plain pass over each prompt + completion (fp32, 1e-5)."""
    from replication.lm import training

    torch.manual_seed(0)
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    for p in training.trainable(model).values():
        torch.nn.init.normal_(p, std=0.05)
    shots = tasks.worked_examples("1d-1step-add", 2, seed=0)
    prompts = [malt.generator_prompt(q, shots) for q in ("1 + 1?", "A longer one: 7 + 5?", "9?")]
    prompts = prompts + prompts[:2]                                # the DPO layout: chosen rows, then rejected
    completions = ["2", "The answer is 12.", "9", "3", "13, I think"]

    def logps_and_grad(fn):
        model.zero_grad()
        logps, mask = fn()
        (logps * mask).sum().backward()
        return (logps * mask).detach(), {n: p.grad.clone() for n, p in training.trainable(model).items()}

    def plain():
        p_ids, p_mask, c_ids, c_mask = training.encode_pairs(tok, prompts, completions)
        return training.completion_logps(model, p_ids, p_mask, c_ids, c_mask), c_mask

    ids = tok(models.chat_prompts(tok, prompts[:3]), return_tensors="pt", padding=True)
    assert models.common_prefix(ids["input_ids"], ids["attention_mask"]) >= models.MIN_SHARED  # the shared path is tested
    want, shared = logps_and_grad(plain), logps_and_grad(lambda: dpo._seq_logps(model, tok, prompts, completions, None))
    assert torch.allclose(want[0], shared[0], atol=1e-5)
    assert all(torch.allclose(want[1][k], shared[1][k], atol=1e-5) for k in want[1])
    assert max(g.abs().max() for g in want[1].values()) > 1e-3


def test_an_arm_takes_the_roles_it_shares_with_another_arm_and_trains_the_rest(tmp_path):
    """train_arm(reuse=...): the roles whose data equal the first arm's are taken from it (not trained again) and
    hold exactly what training them would give; the role whose data differ is trained (same_data_roles)."""
    model, tok = _tiny_roles()
    cfg = dpo.PreferenceConfig(lr=1e-2, epochs=1, batch_size=2, dpo_beta=0.1, seed=0)
    init = {r: malt_training.adapter_state(model, r) for r in malt.ROLES}
    sets_a = ({r: [(p, c) for p, c, _ in PAIRS] for r in malt.ROLES}, {r: PAIRS for r in malt.ROLES})
    sets_b = ({**sets_a[0], "generator": [(p, r) for p, _, r in PAIRS]}, {**sets_a[1], "generator": PAIRS[::-1]})
    val = ({r: [] for r in malt.ROLES}, {r: [] for r in malt.ROLES})
    assert malt_training.same_data_roles((sets_a, val), (sets_b, val)) == ["verifier", "refiner"]

    def cached(name, key, make):
        return cache.cached(tmp_path, name, key, make)

    recipe = malt_training.Recipe(cfg, cfg)
    a = malt_training.train_arm(cached, {"k": 1}, "a", model, tok, init, (sets_a, val), recipe)
    calls = []
    real = malt_training.train_role
    try:
        malt_training.train_role = lambda m, t, role, *args, **kw: calls.append(role) or real(m, t, role, *args, **kw)
        b = malt_training.train_arm(cached, {"k": 1}, "b", model, tok, init, (sets_b, val), recipe, reuse=(a, (sets_a, val)))
    finally:
        malt_training.train_role = real
    assert b["reused"] == ["verifier", "refiner"] and calls == ["generator", "generator"]   # its SFT, then its DPO
    fresh = malt_training.train_arm(cached, {"k": 1}, "b-fresh", model, tok, init, (sets_b, val), recipe)
    for stage in ("sft", "dpo"):
        for r in malt.ROLES:
            assert all(torch.equal(b[stage]["weights"][r][k], fresh[stage]["weights"][r][k]) for k in fresh[stage]["weights"][r])
    assert not all(torch.equal(b["dpo"]["weights"]["generator"][k], a["dpo"]["weights"]["generator"][k])
                   for k in a["dpo"]["weights"]["generator"])


def test_a_training_seed_redraws_lora_a_and_keeps_every_role_at_the_base_model():
    model, tok = _tiny_roles()
    init = {r: malt_training.adapter_state(model, r) for r in malt.ROLES}
    one, again, two = malt_training.seed_init(init, 1), malt_training.seed_init(init, 1), malt_training.seed_init(init, 2)
    ids = torch.tensor([tok("hello there", add_special_tokens=False)["input_ids"]])
    with malt.use_role(model, None):
        base = _logits(model, ids)
    for r in malt.ROLES:
        a_keys = [k for k in init[r] if "lora_A" in k]
        assert a_keys and all(torch.equal(one[r][k], again[r][k]) for k in init[r])           # seeded
        assert all(not torch.equal(one[r][k], init[r][k]) and not torch.equal(one[r][k], two[r][k]) for k in a_keys)
        assert all(torch.equal(one[r][k], init[r][k]) for k in init[r] if k not in a_keys)     # B: still zero
        assert all(one[r][k].abs().max() <= one[r][k].shape[1] ** -0.5 for k in a_keys)      # peft's bound
        malt_training.load_adapter_state(model, r, one[r])
        with malt.use_role(model, r):
            torch.testing.assert_close(_logits(model, ids), base)                          # B = 0: the base model
    assert not torch.equal(one["generator"][a_keys[0]], one["verifier"][a_keys[0]])       # each role its own draw


def test_training_sets_are_the_equal_budget_and_validation_cuts_of_a_seed():
    tree = hand_tree()
    sets, validation = malt.training_sets(tree, tree, max_sft=1, max_pairs=1, seed=3)
    sft_by = {p: malt.sft_examples(tree, p) for p in malt.POOLINGS}
    pairs_by = {p: malt.preference_pairs(tree, p) for p in malt.POOLINGS}
    budget = (malt.equal_budget(sft_by, 1, config.derive_seed(3, "sft-subset")),
              malt.equal_budget(pairs_by, 1, config.derive_seed(3, "dpo-subset")))
    assert sets == {p: (budget[0][p], budget[1][p]) for p in malt.POOLINGS}
    assert validation["global"][1] == {r: malt.subsample(x, 1, 3) for r, x in pairs_by["global"].items()}
    assert all(len(x) <= 1 for p in malt.POOLINGS for part in sets[p] for x in part.values())


def test_figures_show_each_training_seed():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = malt_eval.accuracy_summary(SEEDS, votes=3, n_boot=100, seed=0)
    fig, ax = plt.subplots()
    malt_eval.plot_accuracy(acc, ax, ["C0"] * len(acc))
    dots = [c for c in ax.collections if isinstance(c, matplotlib.collections.PathCollection)]
    assert len(dots) == sum(a["trained"] for a in acc.values()) and all(len(c.get_offsets()) == 2 for c in dots)
    logs = {r: {"sft": [{"loss": 1.0}, {"loss": 0.5}], "dpo": [{"loss": 0.7}]} for r in malt.ROLES}
    trained = {s: {p: {"logs": logs} for p in malt.POOLINGS} for s in (0, 1, 2)}
    fig, axes = plt.subplots(1, 2)
    malt_eval.plot_losses(trained, axes, 0.1, "sft")
    assert len(axes[0].lines) == 3 * len(malt.POOLINGS) * len(malt.ROLES)      # one line per seed, pooling and role
    plt.close("all")


def test_notebook_05s_keys_come_from_its_parameters_and_each_holds_what_it_depends_on():
    """Trees, training and held-out chains: a setting changes exactly the keys of what it feeds."""
    from replication.core import params
    from replication.papers.malt import malt_runs

    cell = params.cell_values(config.ROOT / "notebooks/05_malt_trajectory_trees.ipynb")
    worked = tasks.worked_examples(cell["level"], cell["shots"], 0)
    base = malt_runs.keys(params.build("05_malt_trajectory_trees", cell), worked)
    assert base[0]["seed"] == 0 and "data_seed" not in base[0] and base[1].items() >= base[0].items()
    for name, value, changed in (("n_branch", 4, (1, 1, 1)), ("temperature", 0.9, (1, 1, 1)),
                                 ("sft_lr", 3e-4, (0, 1, 1)), ("dpo_beta", 0.2, (0, 1, 1)),
                                 ("votes", 5, (0, 0, 1)), ("n_heldout", 300, (0, 0, 1)), ("seed", 1, (1, 1, 1))):
        moved = malt_runs.keys(params.build("05_malt_trajectory_trees", {**cell, name: value}), worked)
        assert tuple(int(a != b) for a, b in zip(base, moved)) == changed, name
    assert malt_runs.keys(params.build("05_malt_trajectory_trees", {**cell, "seed": 1}), worked)[0]["data_seed"] == 1


def test_the_recipe_is_built_from_the_notebooks_parameters_with_each_stage_seeded_by_the_training_seed():
    from types import SimpleNamespace

    P = SimpleNamespace(sft_lr=2e-4, sft_epochs=3, dpo_lr=5e-5, dpo_epochs=2, dpo_beta=0.2, reference="base")
    r = malt_training.recipe(P, 7)
    assert (r.sft.lr, r.sft.epochs, r.sft.batch_size, r.sft.seed) == (2e-4, 3, 8, config.derive_seed(7, "sft"))
    assert (r.dpo.lr, r.dpo.epochs, r.dpo.dpo_beta, r.dpo.seed) == (5e-5, 2, 0.2, config.derive_seed(7, "dpo"))
    assert r.reference == "base" and malt_training.recipe(P, 8).sft.seed != r.sft.seed
