"""The `train` command's configs: read, merged over the defaults and checked, every key by name and every value of a
TRL section by its field's type, before anything is built or written (a bad value or malformed YAML is one line).

A config (configs/paper/*.yaml, configs/tiny/*.yaml) has these sections, each checked by name:
  model (a known name, a local checkpoint folder, a hub id, or "tiny" for the tests' random model), seed, output_dir,
  resume (true: carry on from the last checkpoint in output_dir, the reward's or filter's state included; refused,
  in one line, when output_dir's run was started with other settings than trl's length, logging and saving ones:
  train.RESUME_FREE, the run's settings recorded in output_dir/settings.json);
  data: the training prompts (elo-evolve: level, n_train, shots; rlpr: n_arithmetic, n_factual, level, shots);
  lora: r, alpha;
  trl: any field of trl.GRPOConfig (batch, num_generations, learning_rate, beta, max_completion_length, use_vllm,
       vllm_mode, deepspeed, save_steps, ...), passed as is;
  elo-evolve: judge (quality | likelihood | llm, with judge_model), judge_shots, the opponent pool: opponents
       ({name: [temperature, best of, shots]}: sampled from the base model, rated by the judge's round robin) or
       pool_file (JSON {name: [one cached response per training problem]}; made on first use from opponent_models
       {name: checkpoint} when missing) with ratings ({name: Elo}); then
       temperature, k, update_rule, start_rating, length_margin;
  rlpr: baseline (initial: r' from the initial policy, cached before training, as the authors' code | policy),
       format_weight, aggregation, filter (factor: the std filter's factor, ratio, warmup_start, warmup_end; null: no filter);
  mae: mae.MAEConfig's loop settings (proposals and pool_solve per process, n_solve, token caps per role, filter,
       score rule, judge), trained by trl_mae.MAETrainer; data: level, n_seed_questions, shots;
  malt: the trees (n_branch, tokens, temperature, batch_size, tree_model, tree_file), pooling, max_sft, max_pairs;
       MALT has sft and dpo sections (fields of trl.SFTConfig, trl.DPOConfig) instead of trl; data: level, n_train,
       shots.
`--set section.key=value` overrides one setting (e.g. --set trl.vllm_mode=server).
Every process ends by writing rank<k>.json in output_dir: the problems it saw, its adapter's digest and the state of
its reward or filter (so a run can be checked for agreement across processes).
"""
import dataclasses
import typing
from pathlib import Path

import yaml

from replication.core import config
from replication.lm import tasks
from replication.papers.elo_evolve import judging
from replication.papers.mae import mae
from replication.papers.malt import malt

METHODS = ("elo-evolve", "rlpr", "mae", "malt")
SECTIONS = ("model", "seed", "output_dir", "resume", "data", "lora", "trl")  # and the method's own
TRAINERS = {"trl": "GRPOConfig", "sft": "SFTConfig", "dpo": "DPOConfig"}  # sections passed as is to TRL's configs
NOTEBOOKS = {method: stem for stem, (method, _) in config.PAPER_SCALE.items()}  # the notebook each method runs at scale
LORA = {"r": 16, "alpha": 32}
# MAE's own settings (mae.MAEConfig); its lr, LoRA rank, temperature and seed come from the trl, lora and top sections
MAE_FIELDS = ("proposals", "n_solve", "pool_solve", "question_tokens", "answer_tokens", "judge_tokens", "reference_ratio",
              "quality_threshold", "use_filter", "strict_tags", "score_rule", "judge")
DEFAULTS = {
    "elo-evolve": {"judge": "quality", "judge_shots": 0, "judge_model": None,
                   "opponents": {"weak": [1.0, 1], "strong": [0.7, 4]}, "pool_tokens": 32, "pool_file": None,
                   "ratings": None, "opponent_models": None, "temperature": 200.0, "k": 32.0, "update_rule": "mean", "start_rating": 1350.0,
                   "length_margin": 60},
    "rlpr": {"baseline": "initial", "format_weight": 0.1, "aggregation": "mean",
             "filter": {"factor": 0.5, "ratio": 0.99, "warmup_start": 5, "warmup_end": 10}},
    "mae": {name: getattr(mae.MAEConfig, name) for name in MAE_FIELDS},
    "malt": {"n_branch": 3, "tokens": [48, 32, 48], "temperature": 0.7, "batch_size": 16, "pooling": "global",
             "max_sft": 100000, "max_pairs": 100000, "tree_model": None, "tree_file": None},
}
DATA = {"elo-evolve": {"level": "1d-1step-add", "n_train": 64, "shots": 0},
        "rlpr": {"n_arithmetic": 64, "n_factual": 0, "level": "1d-1step-add", "shots": 0},
        "mae": {"level": "1d-1step-add", "n_seed_questions": 64, "shots": 0},
        "malt": {"level": "1d-1step-add", "n_train": 64, "shots": 0}}
TRL_DEFAULTS = {"mae": {"loss_type": "dapo", "beta": 0.0}}  # the token mean over every role's tokens, no KL


def bf16(cfg: dict) -> bool:
    """The models load in bf16 when any trainer section sets bf16 (train.load); else fp32."""
    return any(cfg.get(s, {}).get("bf16") for s in TRAINERS)


def override(cfg: dict, item: str) -> None:
    """Apply one `--set section.key=value` (or `key=value` at the top level; the value read as YAML) to cfg."""
    if "=" not in item:
        raise ValueError(f"--set {item!r} is not allowed; write name=value, e.g. trl.vllm_mode=server")
    name, value = item.split("=", 1)
    *sections, key = name.split(".")
    if len(sections) > 1:
        raise ValueError(f"--set {item!r} is not allowed; a name is key or section.key")
    where = cfg.setdefault(sections[0], {}) if sections else cfg
    if not isinstance(where, dict):
        raise ValueError(f"--set {item!r} is not allowed; {sections[0]} is not a section")
    where[key] = load_yaml(value, f"--set {item}")


def load_yaml(text: str, where: str):
    """YAML from text, or a ValueError naming where it came from, the line and column, and what is wrong."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{where} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None


def read_config(method: str, path, sets=()) -> dict:
    """The config file with the --set overrides, merged over the defaults, every key checked by name."""
    config.check_choice("method", method, METHODS)
    cfg = load_yaml(Path(path).read_text(), f"config {path}") or {}
    if not isinstance(cfg, dict):
        raise ValueError(f"config {path}: the file must hold a mapping of sections")
    for item in sets:
        override(cfg, item)
    for key in cfg:
        config.check_choice("config section", key, sections(method) + (method,))
    out = {"model": "smollm2-135m-instruct", "seed": 0, "output_dir": f"runs/scale/{method}", "resume": False,
           **{k: {} for k in sections(method) if k in TRAINERS},
           **{k: v for k, v in cfg.items() if k not in ("data", "lora", method)}}
    for section, defaults in (("data", DATA[method]), ("lora", LORA), (method, DEFAULTS[method])):
        given = cfg.get(section) or {}
        for key in given:
            config.check_choice(f"{section}.{key}", key, tuple(defaults))
        out[section] = {**defaults, **given}
    config.check_int("seed", out["seed"], minimum=0)
    for section in TRAINERS:
        if section in out:
            check_trl(out[section], section)
    if method == "elo-evolve":
        e = out[method]
        config.check_choice("elo-evolve.judge", e["judge"], judging.JUDGES)
        if e["judge"] == "llm" and not e["judge_model"]:
            raise ValueError("elo-evolve.judge_model=None is not allowed with judge llm; name the judge's checkpoint")
        if e["pool_file"] and not isinstance(e["ratings"], dict):
            raise ValueError("elo-evolve.ratings must map each opponent of pool_file to its rating")
    elif method == "rlpr":
        config.check_choice("rlpr.baseline", out[method]["baseline"], ("initial", "policy"))
    elif method == "mae":
        mae_config(out)  # names any bad value
    else:
        check_malt(out)
    return out


def sections(method: str) -> tuple:
    """The config sections a method takes besides its own: MALT has sft and dpo (TRL's SFTConfig, DPOConfig) for trl."""
    return SECTIONS[:-1] + ("sft", "dpo") if method == "malt" else SECTIONS


def check_malt(cfg: dict) -> None:
    m, d = cfg["malt"], cfg["data"]
    config.check_int("data.n_train", d["n_train"])
    config.check_int("data.shots", d["shots"], minimum=0)
    config.check_choice("data.level", d["level"], tuple(tasks.LEVELS))
    config.check_int("malt.n_branch", m["n_branch"], minimum=2)
    if not (isinstance(m["tokens"], (list, tuple)) and len(m["tokens"]) == 3
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in m["tokens"])):
        raise ValueError(f"malt.tokens={m['tokens']!r} is not allowed; give [generator, verifier, refiner] max new tokens")
    config.check_range("malt.temperature", m["temperature"], 1e-6, 10.0)
    config.check_choice("malt.pooling", m["pooling"], malt.POOLINGS)
    for name in ("batch_size", "max_sft", "max_pairs"):
        config.check_int(f"malt.{name}", m[name])


def check_trl(section: dict, name: str = "trl") -> None:
    """Every key of a trl, sft or dpo section is a field of trl.GRPOConfig, SFTConfig or DPOConfig (output_dir and
    seed are top-level settings)."""
    import trl

    if not isinstance(section, dict):
        raise ValueError(f"{name}={section!r} is not allowed; the section must be a mapping of settings")
    cls = getattr(trl, TRAINERS[name])
    fields = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in section.items():
        if key not in fields or key in ("output_dir", "seed"):
            raise ValueError(f"{name}.{key} is not allowed; use a field of trl.{cls.__name__} other than output_dir "
                             "and seed (those are top-level settings)")
        check_type(f"{name}.{key}", value, hints.get(key))


def check_type(name: str, value, hint) -> None:
    """A ValueError naming the setting unless value fits a plain field type (int, float, bool, str; Optional of
    one): caught here, not as a traceback deep inside TRL or torch. Other field types are left to TRL."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union:
        if value is None:
            return
        hint = args[0] if len(args) == 1 else None
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str)}.get(hint)
    if ok is not None and not ok(value):
        kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[hint]
        raise ValueError(f"{name}={value!r} is not allowed; it must be {kind}")


def mae_config(cfg: dict) -> mae.MAEConfig:
    """mae.MAEConfig from the mae section, the data section's level and shots, the trl temperature and the seed."""
    d = cfg["data"]
    config.check_int("data.n_seed_questions", d["n_seed_questions"])
    return mae.MAEConfig(**{k: cfg["mae"][k] for k in MAE_FIELDS}, seed_level=d["level"], shots=d["shots"],
                         temperature=cfg["trl"].get("temperature", 1.0), lora_r=cfg["lora"]["r"], seed=cfg["seed"]).validate()
