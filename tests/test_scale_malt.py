"""MALT on TRL (replication.scale.trl_malt): TRL's SFT and DPO losses against the workbook's (dpo.sft_loss, dpo.dpo_loss)
on the same examples and pairs of the tiny config's trees, the DPO reference being the SFT policy, and the train
command on one process."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from replication.core import config
from replication.lm import dpo
from replication.papers.malt import malt

trl = pytest.importorskip("trl")
trl_malt = pytest.importorskip("replication.scale.trl_malt")
from replication.scale import configs, train  # noqa: E402  (needs trl)

TINY = config.ROOT / "configs" / "tiny" / "malt.yaml"
ROLE = "refiner"  # the role with the most examples and pairs in the tiny trees


def setup(tmp_path):
    """The tiny config, its trees (the committed file: sampling them would fail here) and the refiner's data."""
    cfg = configs.read_config("malt", TINY, [f"output_dir={tmp_path}"])
    tree = trl_malt.trees(cfg, lambda *a: pytest.fail("the committed tree file must match the tiny config"))
    sft, pairs = trl_malt.role_data(tree, cfg)[ROLE]
    assert len(sft) >= 2 and len(pairs) >= 2
    return cfg, sft, pairs


def perturb(model, adapter="default", seed=1):
    """Move the adapter's LoRA B weights off zero (so the policy differs from the base or the reference)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and f".{adapter}." in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def batch_of(trainer):
    """Every training example of a TRL trainer in dataset order, through its own collator."""
    return trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])


def test_sft_then_dpo_losses_match_the_workbook_with_the_sft_policy_as_reference(tmp_path):
    cfg, sft, pairs = setup(tmp_path)
    model, tok = train.load(cfg)
    sft_trainer = trl_malt.sft_trainer(cfg, ROLE, model, tok, sft, train.lora_config(cfg))
    model = sft_trainer.model
    perturb(model)
    model.train()
    got = sft_trainer.compute_loss(model, batch_of(sft_trainer))
    logps, mask = dpo._seq_logps(model, tok, [p for p, _ in sft], [c for _, c in sft], None)
    want = dpo.sft_loss(logps, mask)
    print(f"SFT loss: TRL {float(got):.8f}, workbook {float(want):.8f}, difference {abs(float(got - want)):.2e}")
    # within 1e-6 relative: the same tokens and positions, batched and padded differently (fp32 sums of ~400 terms)
    assert abs(float(got - want)) < 1e-6 * float(want) and float(want) > 0.1
    # DPO from that policy: TRL copies it into the frozen "ref" adapter, the workbook takes its log-probs up front
    dpo_trainer = trl_malt.dpo_trainer(cfg, ROLE, model, tok, pairs)
    model = dpo_trainer.model
    assert set(model.peft_config) == {"default", "ref"}
    params = dict(model.named_parameters())
    assert all(torch.equal(p, params[n.replace(".default.", ".ref.")]) for n, p in params.items() if ".default." in n)
    prompts, completions = [p for p, _, _ in pairs] * 2, [c for _, c, _ in pairs] + [r for _, _, r in pairs]
    with torch.no_grad():
        ref = dpo._seq_sums(model, tok, prompts, completions, None)
    perturb(model, seed=2)  # one DPO step's worth of change, in one go
    got = dpo_trainer.compute_loss(model, batch_of(dpo_trainer))
    seq, k = dpo._seq_sums(model, tok, prompts, completions, None), len(pairs)
    want, margin = dpo.dpo_loss(seq[:k], seq[k:], ref[:k], ref[k:], cfg["dpo"]["beta"])
    print(f"DPO loss: TRL {float(got):.8f}, workbook {float(want):.8f}, difference {abs(float(got - want)):.2e}")
    # within 2e-6 relative: the loss is a log-sigmoid of differences of four fp32 sums of ~400 token log-probs, so it
    # carries their rounding (measured 7.2e-7 absolute, 1.2e-6 relative, at one torch thread; less at two); a wrong
    # reference or a token off by one moves it by far more than 1e-3
    assert abs(float(got - want)) < 2e-6 * float(want) and margin.abs().max() > 0.1


def test_trees_are_keyed_by_their_settings_and_roles_cut_to_the_limits(tmp_path):
    cfg, _, _ = setup(tmp_path)
    saved = json.loads((config.ROOT / cfg["malt"]["tree_file"]).read_text())
    assert saved["key"] == trl_malt.tree_key(cfg)
    assert trl_malt.tree_key({**cfg, "seed": 1}) != saved["key"]
    for section, change in (("malt", {"batch_size": 3}), ("sft", {"bf16": True})):   # which samples, in what precision
        assert trl_malt.tree_key({**cfg, section: {**cfg[section], **change}}) != saved["key"]
    data = trl_malt.role_data(saved["tree"], {**cfg, "malt": {**cfg["malt"], "max_sft": 1, "max_pairs": 1}})
    assert all(len(s) <= 1 and len(p) <= 1 for s, p in data.values())
    assert data[ROLE][0][0] in malt.sft_examples(saved["tree"])[ROLE]


def test_bad_malt_settings_are_named(tmp_path):
    path = tmp_path / "c.yaml"
    for text, name in (("malt: {tokens: [8, 8]}", r"malt\.tokens"), ("malt: {pooling: mean}", r"malt\.pooling"),
                       ("malt: {n_branch: 1}", r"malt\.n_branch"), ("sft: {learning_rat: 1}", r"sft\.learning_rat"),
                       ("dpo: {betta: 1}", r"dpo\.betta"), ("trl: {beta: 0}", "config section")):
        path.write_text(text)
        with pytest.raises(ValueError, match=name):
            configs.read_config("malt", path)


def test_train_command_runs_sft_then_dpo_for_every_role(tmp_path):
    out = tmp_path / "malt"
    text = TINY.read_text().replace("runs/scale/tiny-malt", str(out))
    (tmp_path / "tiny.yaml").write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(config.ROOT)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "replication", "train", "malt", "--config", str(tmp_path / "tiny.yaml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"one-process malt run: {time.perf_counter() - t0:.1f} s")
    record = json.loads((out / "rank0.json").read_text())
    for role in malt.ROLES:
        r = record["roles"][role]
        assert r["sft_examples"] and r["pairs"], role
        steps = [row for row in r["dpo"] if "loss" in row]
        assert len(steps) == 2 and (out / role / "adapter" / "adapter_config.json").is_file()
    assert len({r["adapter_sha256"] for r in record["roles"].values()}) == 3
