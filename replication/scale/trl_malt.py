"""MALT on TRL: SFTTrainer then DPOTrainer for each role (generator, verifier, refiner), one LoRA adapter each.

The data are the workbook's own (replication.papers.malt.malt): trajectory trees sampled from the base model (malt.sample_trees,
cached in a JSON file keyed by its settings), value iteration and pooling, the positives as SFT examples
(malt.sft_examples) and sibling pairs as DPO pairs (malt.preference_pairs), cut to max_sft / max_pairs per role
(malt.subsample). Each role then trains from the base model: TRL's SFTTrainer on its positives with a fresh LoRA
adapter, then TRL's DPOTrainer on its pairs from that adapter; given a PEFT model and no reference model, TRL copies
the adapter as it is (the SFT policy) into a frozen "ref" adapter, so the DPO reference is the SFT policy, as in
the paper and the workbook's dpo.train_dpo(reference="initial"). Prompts are given to TRL already chat-templated
(models.chat_prompts), and TRL appends EOS to each completion, so the tokens are those of the workbook's
training.encode_pairs: the SFT and DPO losses are the workbook's (dpo.sft_loss, dpo.dpo_loss;
tests/test_scale_malt.py). Each role's final adapter is saved to <output_dir>/<role>/adapter.
"""
import json
from pathlib import Path

from replication.core import config, files
from replication.lm import models, tasks
from replication.papers.malt import malt
from . import configs

SETTINGS = ("n_branch", "tokens", "temperature", "batch_size", "pooling", "max_sft", "max_pairs", "tree_model",
            "tree_file")


def tree_key(cfg: dict) -> dict:
    """What identifies the trees: the sampling model and its precision, the questions, the branching, the lengths,
    the sampling batch (each batch draws from its own seed), the role prompts."""
    d, m = cfg["data"], cfg["malt"]
    return {"model": m["tree_model"] or cfg["model"], "level": d["level"], "n_train": d["n_train"], "shots": d["shots"],
            "n": m["n_branch"], "tokens": list(m["tokens"]), "temperature": m["temperature"], "seed": cfg["seed"],
            "batch_size": m["batch_size"], "bf16": configs.bf16(cfg),
            "prompts": malt.prompt_key(tasks.worked_examples(d["level"], d["shots"], cfg["seed"]) if d["shots"] else ())}


def trees(cfg: dict, load) -> dict:
    """The training trees: read from tree_file when it holds trees of these settings, else sampled from the tree
    model (the base model: no adapter) with the workbook's generation and written there. Under accelerate the
    main process samples first; the others then read its file."""
    from accelerate import PartialState

    d, m, key = cfg["data"], cfg["malt"], tree_key(cfg)
    path = Path(m["tree_file"]) if m["tree_file"] else Path(cfg["output_dir"]) / "trees.json"
    path = path if path.is_absolute() or not m["tree_file"] else config.ROOT / path  # a repository file
    with PartialState().main_process_first():
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved.get("key") == key:
                return saved["tree"]
            print(f"malt.tree_file {path}: made with other settings; sampling the trees again")
        model, tok = load(cfg, key["model"])
        problems = tasks.make_level(d["level"], d["n_train"], seed=cfg["seed"])
        shots = tasks.worked_examples(d["level"], d["shots"], cfg["seed"]) if d["shots"] else []
        tree = malt.sample_trees(model, tok, problems, m["n_branch"], tuple(m["tokens"]), m["temperature"], cfg["seed"],
                                 m["batch_size"], shots=shots)
        if PartialState().is_main_process:
            files.write_json(path, {"key": key, "tree": tree})
    return tree


def role_data(tree: dict, cfg: dict) -> dict:
    """role -> (SFT examples, DPO pairs), each cut to at most max_sft / max_pairs (a seeded subsample)."""
    m, seed = cfg["malt"], cfg["seed"]
    config.check_choice("malt.pooling", m["pooling"], malt.POOLINGS)
    sft, pairs = malt.sft_examples(tree, m["pooling"]), malt.preference_pairs(tree, m["pooling"])
    return {r: (malt.subsample(sft[r], m["max_sft"], config.derive_seed(seed, "scale-sft", r)),
                malt.subsample(pairs[r], m["max_pairs"], config.derive_seed(seed, "scale-pairs", r))) for r in malt.ROLES}


def prompt_text(tok, prompt) -> str:
    """A role prompt as the chat-templated text TRL tokenizes; a BOS the tokenizer adds itself is not doubled."""
    text = models.chat_prompts(tok, [prompt])[0]
    adds_bos = tok.bos_token is not None and tok("")["input_ids"][:1] == [tok.bos_token_id]
    return text[len(tok.bos_token):] if adds_bos and text.startswith(tok.bos_token) else text


def sft_dataset(tok, examples):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [prompt_text(tok, p) for p, _ in examples], "completion": [c for _, c in examples]})


def dpo_dataset(tok, pairs):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [prompt_text(tok, p) for p, _, _ in pairs], "chosen": [c for _, c, _ in pairs],
                              "rejected": [r for _, _, r in pairs]})


def trainer_args(cfg: dict, stage: str, role: str):
    """trl.SFTConfig or trl.DPOConfig from the sft / dpo section, with the role's output folder and the run's seed."""
    from trl import DPOConfig, SFTConfig

    cls = SFTConfig if stage == "sft" else DPOConfig
    return cls(**{"report_to": "none", "logging_steps": 1, "save_strategy": "no", **cfg[stage],
                  "output_dir": str(Path(cfg["output_dir"]) / role / stage), "seed": cfg["seed"]})


def sft_trainer(cfg: dict, role: str, model, tok, examples, peft_config):
    from trl import SFTTrainer

    return SFTTrainer(model=model, args=trainer_args(cfg, "sft", role), train_dataset=sft_dataset(tok, examples),
                      processing_class=tok, peft_config=peft_config)


def dpo_trainer(cfg: dict, role: str, model, tok, pairs):
    """TRL's DPOTrainer on a PEFT model (the SFT policy): its adapter copied into the frozen reference "ref"."""
    from trl import DPOTrainer

    return DPOTrainer(model=model, ref_model=None, args=trainer_args(cfg, "dpo", role),
                      train_dataset=dpo_dataset(tok, pairs), processing_class=tok)


def train_role(cfg: dict, role: str, sft, pairs, load, peft_config) -> dict:
    """SFT then DPO for one role from the base model; the adapter saved to <output_dir>/<role>/adapter. A role with
    no SFT examples starts DPO from a fresh adapter (the base model); with no pairs it ends after SFT."""
    import torch
    from peft import get_peft_model

    model, tok = load(cfg)
    torch.manual_seed(config.derive_seed(cfg["seed"], "scale-lora", role))
    log = {"sft_examples": len(sft), "pairs": len(pairs), "sft": [], "dpo": []}
    if sft:
        trainer = sft_trainer(cfg, role, model, tok, sft, peft_config)
        trainer.train()
        model, log["sft"] = trainer.model, trainer.state.log_history
    else:
        model = get_peft_model(model, peft_config)
    if pairs:
        trainer = dpo_trainer(cfg, role, model, tok, pairs)
        trainer.train()
        model, log["dpo"] = trainer.model, trainer.state.log_history
    folder = Path(cfg["output_dir"]) / role / "adapter"
    model.save_pretrained(str(folder), selected_adapters=["default"])
    return {**log, "model": model}


def train(cfg: dict, load, peft_config, digest) -> dict:
    """Trees, role data, then each role's SFT and DPO; with resume, a role whose adapter is saved is skipped.
    Returns this process's record (the run's settings, per role: data sizes, logs, adapter digest)."""
    from accelerate import PartialState

    tree = trees(cfg, load)
    data = role_data(tree, cfg)
    out = {"method": "malt", "process": PartialState().process_index, "processes": PartialState().num_processes,
           "questions": len(tree["questions"]), "leaf_reward": sum(tree["reward"]) / max(1, len(tree["reward"])), "roles": {}}
    for role in malt.ROLES:
        if cfg["resume"] and (Path(cfg["output_dir"]) / role / "adapter").is_dir():
            out["roles"][role] = {"skipped": "adapter saved by an earlier run"}
            continue
        log = train_role(cfg, role, *data[role], load, peft_config)
        out["roles"][role] = {**{k: v for k, v in log.items() if k != "model"}, "adapter_sha256": digest(log["model"])}
    return out
