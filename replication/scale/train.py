"""`python -m replication train <method> --config <yaml>`: one method on TRL's trainers, the same command on one
CPU process and under `accelerate launch` (data parallel, DeepSpeed ZeRO-3, vLLM through the `trl:` settings). The
config's sections are in replication.scale.configs. Every process ends by writing rank<k>.json in output_dir: the
problems it saw, its adapter's digest and the state of its reward or filter (so a run can be checked for agreement
across processes)."""
import argparse
import hashlib
import json
import os
import sys
from pathlib import Path


from replication.core import config, console, files
from replication.lm import elo, models, tasks
from replication.papers.elo_evolve import evolve, judging
from replication.papers.mae import mae
from replication.papers.rlpr import answers, rlpr, rlpr_training
from . import configs, trl_grpo, trl_mae, trl_malt
from .configs import METHODS, TRL_DEFAULTS, mae_config, read_config

def grpo_args(cfg: dict, method: str = None):
    """trl.GRPOConfig from the trl section, with the run's output_dir and seed."""
    from trl import GRPOConfig

    return GRPOConfig(**{"report_to": "none", "logging_steps": 1, "save_strategy": "steps", "loss_type": "grpo",
                         **TRL_DEFAULTS.get(method, {}), **cfg["trl"], "output_dir": cfg["output_dir"], "seed": cfg["seed"]})


def mae_pieces(cfg: dict):
    """(dataset, trainer kwargs) for MAE: the seed questions (notebook 06's pool) start the question pool; TRL's
    dataloader rows only pace the steps."""
    from datasets import Dataset

    d = cfg["data"]
    seeds = tasks.make_level(d["level"], d["n_seed_questions"], seed=cfg["seed"])
    ds = Dataset.from_dict({"prompt": [trl_grpo.chat(mae.solve_prompt(p.question)) for p in seeds]})
    return ds, {"mae_cfg": mae_config(cfg), "seeds": seeds}


def no_reward(prompts, completions, **kwargs):
    """TRL's reward slot for MAE, never called: the rewards come from mae.collect."""
    raise RuntimeError("MAETrainer scores its rollouts with mae.collect")


def load(cfg: dict, name: str = None):
    """(model, tokenizer) of the config's model (or `name`), in bf16 when trl.bf16 is set; "tiny" is the tests'
    random model seeded by the run's seed."""
    import torch

    name = name or cfg["model"]
    if name == "tiny":
        return models.tiny_model(seed=cfg["seed"])
    return models.load_model(name, dtype=torch.bfloat16 if configs.bf16(cfg) else torch.float32)


def lora_config(cfg: dict):
    """The LoRA adapter TRL attaches (peft_config): rank r, alpha, on the workbook's target projections."""
    from peft import LoraConfig

    config.check_int("lora.r", cfg["lora"]["r"])
    return LoraConfig(r=cfg["lora"]["r"], lora_alpha=cfg["lora"]["alpha"], target_modules=list(models.LORA_TARGETS),
                      task_type="CAUSAL_LM")


def elo_pieces(cfg: dict, tok, base):
    """(dataset, reward, parts to checkpoint) for Elo-Evolve: the opponents' responses from the base model before
    its adapter is attached (evolve.build_pool) and their ratings fitted to the judge's round robin with the policy
    at start anchored at start_rating, as notebook 02 does. The likelihood judge scores with a frozen copy."""
    from datasets import Dataset

    e, d, seed = cfg["elo-evolve"], cfg["data"], cfg["seed"]
    problems = tasks.make_level(d["level"], d["n_train"], seed=seed)
    shots = tasks.worked_examples(d["level"], d["shots"], seed) if d["shots"] else []
    # the likelihood judge scores with a frozen copy of the base model; the LLM judge with its own model
    frozen = None if e["judge"] == "quality" else load(cfg, e["judge_model"] if e["judge"] == "llm" else None)
    judge = judging.make_judge(e["judge"], frozen, d["level"], e["judge_shots"], seed)
    if e["pool_file"]:  # the opponents' cached responses, one per training problem, and their ratings
        path = repo_file(e["pool_file"])
        if not path.is_file() or pool_made_for_other(path, cfg):
            if path.is_file():
                print(f"elo-evolve.pool_file {path}: made with other settings; the opponents answer again")
            make_pool(cfg, problems, path)
        pool = json.loads(path.read_text())
        if sorted(pool) != sorted(e["ratings"]) or any(len(r) != len(problems) for r in pool.values()):
            raise ValueError(f"elo-evolve.pool_file {e['pool_file']} must hold {len(problems)} responses for each "
                             f"opponent of elo-evolve.ratings ({', '.join(e['ratings'])})")
        ratings = [float(e["ratings"][n]) for n in pool]
    else:
        specs = evolve.opponent_specs(e["opponents"], cfg["trl"].get("temperature", 1.0), d["shots"])
        pool = evolve.build_pool(base, tok, problems, specs, e["pool_tokens"], seed, level=d["level"], progress=False)
        names = list(pool)
        ratings = elo.fit_ratings(evolve.win_matrix(judge, problems, pool), anchor=names.index(evolve.START_PLAYER),
                                  anchor_rating=e["start_rating"])
    reward = trl_grpo.EloReward(judge, pool, ratings, e["temperature"], e["k"], e["update_rule"], e["start_rating"],
                               e["length_margin"], seed)
    ds = Dataset.from_dict({"prompt": [trl_grpo.chat(p.chat(shots)) for p in problems], "index": list(range(len(problems))),
                            "question": [p.question for p in problems], "answer": [p.answer for p in problems]})
    return ds, reward, {"elo": reward}


def repo_file(name) -> Path:
    """A data file named in a config: relative names are the repository's (config.ROOT)."""
    return Path(name) if Path(name).is_absolute() else config.ROOT / name


def pool_key(cfg: dict) -> dict:
    """What a pool this command makes depends on: the problems (level, count, seed), the prompt's worked examples,
    the opponents' models and precision, the sampling temperature and length."""
    e, d = cfg["elo-evolve"], cfg["data"]
    return {"level": d["level"], "n_train": d["n_train"], "shots": d["shots"], "seed": cfg["seed"],
            "temperature": float(cfg["trl"].get("temperature", 1.0)), "pool_tokens": e["pool_tokens"],
            "opponents": list(e["ratings"]), "opponent_models": e["opponent_models"], "bf16": configs.bf16(cfg)}


def pool_key_file(path: Path) -> Path:
    """The key a made pool_file is written with, beside it (<pool_file>.key.json)."""
    return path.with_name(path.name + ".key.json")


def pool_made_for_other(path: Path, cfg: dict) -> bool:
    """True when pool_file was made by this command with other settings (its key file differs), so it is made
    again; a pool_file without a key file is one the user supplied, and is read as it is."""
    keyed = pool_key_file(path)
    return keyed.is_file() and json.loads(keyed.read_text()) != json.loads(json.dumps(pool_key(cfg)))


def make_pool(cfg: dict, problems, path: Path) -> None:
    """Write pool_file and its key file (pool_key): every opponent of `ratings` answers each training problem once,
    sampled from its own model (opponent_models: name -> checkpoint) with the policy's prompt and the trl
    temperature by the workbook's opponent generation (evolve.build_pool, best of 1), pool_tokens new tokens. The
    main process writes it; the others then read it."""
    from accelerate import PartialState

    e, d = cfg["elo-evolve"], cfg["data"]
    missing = [n for n in e["ratings"] if n not in (e["opponent_models"] or {})]
    if missing:
        raise ValueError(f"elo-evolve.opponent_models must name each opponent's model to build pool_file {path} "
                         f"(missing: {', '.join(missing)})")
    with PartialState().main_process_first():
        if path.is_file() and pool_key_file(path).is_file() and not pool_made_for_other(path, cfg):
            return
        pool = {}
        for name in e["ratings"]:
            model, tok = load(cfg, e["opponent_models"][name])
            spec = evolve.OpponentSpec(name, float(cfg["trl"].get("temperature", 1.0)), 1, d["shots"])
            pool.update(evolve.build_pool(model, tok, problems, [spec], e["pool_tokens"], cfg["seed"], d["level"], False))
            del model
        if PartialState().is_main_process:
            files.write_json(path, pool)
            files.write_json(pool_key_file(path), pool_key(cfg))


def rlpr_pieces(cfg: dict, tok, model):
    """(dataset, reward, filter) for RLPR: the question set of notebook 03 (answers.make_questions), r' from the
    initial policy when baseline is "initial"."""
    from datasets import Dataset

    r, d, seed = cfg["rlpr"], cfg["data"], cfg["seed"]
    qs = answers.make_questions(d["n_arithmetic"], d["n_factual"], seed=seed, level=d["level"], n_heldout=0)["train"]
    shots = tasks.worked_examples(d["level"], d["shots"], seed) if d["shots"] else []
    temperature = cfg["trl"].get("temperature", 1.0)
    baseline = "policy"
    if r["baseline"] == "initial":
        probs = rlpr.baseline_probs(model, tok, [q.chat(shots) for q in qs], [q.reference for q in qs],
                                    temperature=temperature)
        baseline = {q.id: p for q, p in zip(qs, probs)}
    reward = rlpr.Reward(None, tok, "probability", r["aggregation"], baseline, r["format_weight"], temperature)
    f = r["filter"]
    filt = None if f is None else rlpr_training.StdFilter(f["factor"], f["ratio"], f["warmup_start"], f["warmup_end"])
    ds = Dataset.from_dict({"prompt": [trl_grpo.chat(q.chat(shots)) for q in qs], "id": [q.id for q in qs],
                            "reference": [q.reference for q in qs], "aliases": [list(q.aliases) for q in qs],
                            "value": [q.value for q in qs]})
    return ds, trl_grpo.RLPRReward(reward), filt


def build(method: str, cfg: dict):
    """The TRL trainer of one method and the parts whose state goes into its checkpoints."""
    import torch
    from trl import GRPOTrainer

    config.set_seed(cfg["seed"])
    model, tok = load(cfg)
    args = grpo_args(cfg, method)
    if method == "elo-evolve":
        ds, reward, parts = elo_pieces(cfg, tok, model)
        trainer_cls, extra = GRPOTrainer, {}
    elif method == "rlpr":
        ds, reward, filt = rlpr_pieces(cfg, tok, model)
        trainer_cls, extra = trl_grpo.RLPRTrainer, {"std_filter": filt}
    else:

        (ds, extra), reward = mae_pieces(cfg), no_reward
        trainer_cls = trl_mae.MAETrainer
    torch.manual_seed(config.derive_seed(cfg["seed"], "scale-lora"))
    trainer = trainer_cls(model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                          peft_config=lora_config(cfg), **extra)
    parts = parts if method == "elo-evolve" else {method: trainer}
    trainer.add_callback(trl_grpo.SaveState(**parts))
    return trainer, reward, parts


def adapter_digest(model) -> str:
    """sha256 of the trainable weights (names and bytes, in name order)."""
    h = hashlib.sha256()
    for name, p in sorted((n, p) for n, p in model.named_parameters() if p.requires_grad):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


# Settings a resumed run may change: how far it runs and what it logs and saves. (A larger trl.max_steps carries the
# run on; with a decaying learning-rate schedule the remaining steps then follow the new length, as TRL resumes.)
RESUME_FREE = ("resume", "trl.max_steps", "trl.num_train_epochs", "trl.save_steps", "trl.save_total_limit",
               "trl.logging_steps", "trl.report_to")


def settings_file(out: Path) -> Path:
    """The settings a run in output_dir was started with (written by train; read when it resumes)."""
    return Path(out) / "settings.json"


def as_json(cfg: dict) -> dict:
    """cfg as its settings file holds it (anything not JSON written as its text)."""
    return json.loads(json.dumps(cfg, default=str))


def changed_settings(out: Path, cfg: dict) -> list:
    """The settings (section.key) in which cfg differs from those output_dir's run was started with, other than
    RESUME_FREE; [] when output_dir records none (an empty folder, or a run from before the record was kept)."""
    path = settings_file(out)
    if not path.is_file():
        return []

    def flat(d, prefix=""):   # {"trl": {"beta": 0}} -> {"trl.beta": 0}
        keys = {}
        for key, val in d.items():
            keys.update(flat(val, f"{prefix}{key}.") if isinstance(val, dict) else {f"{prefix}{key}": val})
        return keys

    old, new = flat(files.read_json(path)), flat(as_json(cfg))
    return sorted(k for k in old.keys() | new.keys() if k not in RESUME_FREE and old.get(k) != new.get(k))


def start(cfg: dict) -> None:
    """Before anything is built: with resume, refuse an output_dir whose run was started with other settings (one
    line naming them); then record this run's settings there (the main process, RANK 0 under `accelerate launch`: the
    distributed state is left for the trainer to set up)."""
    out = Path(cfg["output_dir"])
    changed = changed_settings(out, cfg) if cfg["resume"] else []
    if changed:
        raise ValueError(f"resume=true is not allowed here: {out} holds a run started with other settings "
                         f"({', '.join(changed)}); give another output_dir, or resume=false to start it over")
    if int(os.environ.get("RANK", "0")) == 0:
        files.write_json(settings_file(out), as_json(cfg))


def train(method: str, cfg: dict) -> dict:
    """Build, resume if asked, train, and write this process's rank<k>.json; returns that record. cfg: read_config's."""
    import torch.distributed as dist
    from transformers.trainer_utils import get_last_checkpoint

    start(cfg)
    if method == "malt":
        from accelerate import PartialState

        config.set_seed(cfg["seed"])
        record = trl_malt.train(cfg, load, lora_config(cfg), adapter_digest)
        files.write_json(Path(cfg["output_dir"]) / f"rank{PartialState().process_index}.json", record)
        return record
    trainer, reward, parts = build(method, cfg)
    out = Path(cfg["output_dir"])
    last = get_last_checkpoint(str(out)) if cfg["resume"] and out.is_dir() else None
    if last is not None:
        trl_grpo.load_state(last, **parts)
    trainer.train(resume_from_checkpoint=last)
    state = trainer.accelerator.state
    record = {"method": method, "process": state.process_index, "processes": state.num_processes,
              "backend": dist.get_backend() if dist.is_initialized() else None,
              "steps": trainer.state.global_step, "adapter_sha256": adapter_digest(trainer.model),
              "seen": getattr(reward, "seen", None), "state": {k: p.state_dict() for k, p in parts.items()},
              "log": trainer.state.log_history}
    files.write_json(out / f"rank{state.process_index}.json", record)
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replication train")
    ap.add_argument("method", help=f"one of {', '.join(METHODS)}")
    ap.add_argument("--config", required=True, help="a YAML file: configs/paper/<method>.yaml, configs/tiny/...")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one setting of the config (the value read as YAML), e.g. trl.vllm_mode=server")
    args = ap.parse_args(argv)
    console.quiet_warnings()
    try:
        if not Path(args.config).is_file():
            raise ValueError(f"--config {args.config!r} is not a file")
        cfg = read_config(args.method, args.config, args.set)  # every setting checked before anything is written
        out = Path(cfg["output_dir"])
        record = train(args.method, cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    import torch.distributed as dist

    if dist.is_initialized():  # left to interpreter exit, gloo's threads sometimes abort the process (SIGABRT)
        dist.barrier()
        dist.destroy_process_group()
    if args.method == "malt":
        print(f"process {record['process']}: " + ", ".join(
            f"{r} {x.get('sft_examples', 0)} SFT examples, {x.get('pairs', 0)} pairs, adapter "
            f"{x.get('adapter_sha256', 'kept')[:12]}" for r, x in record["roles"].items()) + f"; output: {out.resolve()}")
        return 0
    print(f"process {record['process']}: {record['steps']} steps, adapter {record['adapter_sha256'][:12]}; output: "
          f"{out.resolve()} (rank{record['process']}.json, checkpoints)")
    return 0

