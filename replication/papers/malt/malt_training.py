"""MALT's training: one LoRA adapter per role on the shared base model, each seed's initial adapters, and SFT then
DPO on the SFT policy per role (an arm), each stage made once through the run's cache (the data: malt)."""
from dataclasses import dataclass

from replication.core import config, store
from replication.lm import dpo, models

from .malt import ROLES

REFERENCES = ("sft", "base")
BATCH = 8   # examples (SFT) or pairs (DPO) per update, every stage and role


@dataclass(frozen=True)
class Recipe:
    """How every role of an arm trains: SFT with `sft`, then DPO with `dpo` whose reference is the SFT policy
    ('sft') or the base model ('base')."""
    sft: dpo.PreferenceConfig
    dpo: dpo.PreferenceConfig
    reference: str = "sft"


def recipe(params, seed: int) -> Recipe:
    """Notebook 05's recipe for training seed `seed` from its parameters (run.params): SFT at sft_lr for
    sft_epochs, DPO at dpo_lr for dpo_epochs with dpo_beta, batches of BATCH, each stage's draws seeded from
    (seed, stage)."""
    P = params
    return Recipe(dpo.PreferenceConfig(lr=P.sft_lr, epochs=P.sft_epochs, batch_size=BATCH,
                                       seed=config.derive_seed(seed, "sft")),
                  dpo.PreferenceConfig(lr=P.dpo_lr, epochs=P.dpo_epochs, batch_size=BATCH, dpo_beta=P.dpo_beta,
                                       seed=config.derive_seed(seed, "dpo")),
                  P.reference)


def add_role_adapters(model, r: int = 16, alpha: int = 32):
    """One LoRA adapter per role on the shared base model."""
    for role in ROLES:
        model = models.add_lora(model, r=r, alpha=alpha, adapter_name=role)
    return model


def adapter_state(model, role) -> dict:
    """A copy of one role's adapter weights."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=role).items()}


def seed_init(init: dict, seed: int) -> dict:
    """The initial adapters of training seed `seed`: init (role -> adapter state) with every LoRA A matrix drawn
    afresh as peft draws it (uniform on +-1/sqrt(fan_in)) from a generator seeded by (seed, role); B stays zero, so
    every role still starts as the base model."""
    import torch

    out = {}
    for role, state in init.items():
        g = torch.Generator().manual_seed(config.derive_seed(seed, "malt-lora", role))
        out[role] = {}
        for k, w in state.items():   # (r, fan_in) for A
            out[role][k] = ((torch.rand(w.shape, generator=g) * 2 - 1) / w.shape[1] ** 0.5).to(w) if "lora_A" in k else w.clone()
    return out


def load_adapter_state(model, role, state) -> None:
    """Put saved weights back into one role's adapter (models.WeightsMissing where the results store withheld them)."""
    from peft import set_peft_model_state_dict

    if store.withheld_in(state):
        raise models.WeightsMissing(store.missing_weights(f"the {role} adapter of a MALT stage"))

    set_peft_model_state_dict(model, state, adapter_name=role)


def train_dpo_sft_reference(model, tok, pairs, cfg: dpo.PreferenceConfig, adapter_name, progress=False,
                            validation=None) -> list:
    """DPO whose reference is the adapter as it is now (the SFT policy)."""
    return dpo.train_dpo(model, tok, pairs, cfg, adapter_name, progress, reference="initial", validation=validation)


def train_role(model, tok, role, sft, pairs, sft_cfg, dpo_cfg, reference="sft", stage="both", validation=None) -> dict:
    """SFT then DPO on one role's adapter; the DPO reference is the SFT policy ('sft') or the base ('base').
    `validation` = (held-out SFT examples, held-out pairs) of the role: each stage ends at the epoch with the
    lowest validation loss (dpo.train_sft / dpo.train_dpo), epoch 0 (no change) included."""
    config.check_choice("reference", reference, REFERENCES)
    config.check_choice("stage", stage, ("sft", "dpo", "both"))
    val_sft, val_pairs = validation or (None, None)
    logs = {"sft": [], "dpo": []}
    if stage in ("sft", "both") and sft:
        logs["sft"] = dpo.train_sft(model, tok, sft, sft_cfg, adapter_name=role, progress=False, validation=val_sft or None)
    if stage in ("dpo", "both") and pairs:
        logs["dpo"] = (train_dpo_sft_reference(model, tok, pairs, dpo_cfg, role, validation=val_pairs or None)
                       if reference == "sft" else
                       dpo.train_dpo(model, tok, pairs, dpo_cfg, adapter_name=role, progress=False, validation=val_pairs or None))
    return logs


def train_stage(model, tok, sft_sets, pair_sets, sft_cfg, dpo_cfg, reference="sft", stage="both", validation=None,
                done=None) -> dict:
    """One stage ('sft', 'dpo' or 'both') for every role, each on its own adapter (train_role); `validation` =
    (role -> held-out SFT examples, role -> held-out pairs). `done`, another stage result of the same kind, gives
    the roles in it (same start, same data) their weights and logs as they are, untrained again. Returns
    {"weights": role -> adapter state, "logs": role -> {"sft": rows, "dpo": rows}}: a value run.cached stores."""
    done = done or {"weights": {}, "logs": {}}
    val = (lambda r: (validation[0][r], validation[1][r])) if validation else (lambda r: None)
    logs = {}
    for r in ROLES:
        if r in done["weights"]:
            load_adapter_state(model, r, done["weights"][r])
        logs[r] = done["logs"][r] if r in done["weights"] else train_role(
            model, tok, r, sft_sets[r], pair_sets[r], sft_cfg, dpo_cfg, reference, stage, val(r))
    return {"weights": {r: adapter_state(model, r) for r in ROLES}, "logs": logs}


def stage_summary(logs: dict) -> dict:
    """Per role and stage: steps, first and last training loss, the validation loss per epoch (0 = before) and the
    epoch kept (the held-out check)."""
    out = {}
    for role, by_stage in logs.items():
        for stage, rows in by_stage.items():
            last = rows[-1] if rows else {}
            out[f"{role} {stage}"] = {"steps": 0} if not rows else {
                "steps": len(rows), "loss_first": rows[0]["loss"], "loss_last": last["loss"],
                "val_curve": last.get("val_curve"), "best_epoch": last.get("best_epoch")}
    return out


def same_data_roles(data_a: tuple, data_b: tuple) -> list:
    """Roles with the same SFT examples, pairs and validation sets in two arms' data ((sets, validation), each
    (role -> SFT examples, role -> pairs)): from the same initial adapters, the same training (each role is an
    adapter of its own; local and global pooling agree on verifier and refiner)."""
    return [r for r in ROLES if all(a[k][r] == b[k][r] for a, b in zip(data_a, data_b) for k in (0, 1))]


def train_arm(cache, key: dict, name: str, model, tok, init: dict, data: tuple, recipe: Recipe, after_sft=None,
              reuse=None) -> dict:
    """One MALT arm from the initial adapters `init` (role -> state): SFT, then DPO, every role, as `recipe` says,
    each stage made once through cache(name, key, make) (run.cached's signature). data = (sets, validation), each
    (role -> SFT examples, role -> pairs). after_sft(), if given, runs with the SFT weights loaded (e.g. their
    evaluation). `reuse` = (another arm's result from the same init, its data): roles trained on the same data
    there (same_data_roles) are taken from it. Returns {"sft": stage, "dpo": stage, "logs": role ->
    {"sft": rows, "dpo": rows}, "reused": roles}; the model ends with the arm's final (DPO) weights."""
    load_stage(model, {"weights": init})
    k, (sets, validation), R = {**key, "arm": name}, data, recipe
    roles = same_data_roles(data, reuse[1]) if reuse else []
    done = {s: {part: {r: reuse[0][s][part][r] for r in roles} for part in ("weights", "logs")} for s in ("sft", "dpo")}
    sft_out = cache(f"sft-{name}", k, lambda: train_stage(model, tok, *sets, R.sft, R.dpo, R.reference, "sft",
                                                          validation, done["sft"]))
    load_stage(model, sft_out)
    if after_sft is not None:
        after_sft()
    dpo_out = cache(f"dpo-{name}", k, lambda: train_stage(model, tok, *sets, R.sft, R.dpo, R.reference, "dpo",
                                                          validation, done["dpo"]))
    load_stage(model, dpo_out)
    return {"sft": sft_out, "dpo": dpo_out, "reused": roles,
            "logs": {r: {"sft": sft_out["logs"][r]["sft"], "dpo": dpo_out["logs"][r]["dpo"]} for r in ROLES}}


def load_stage(model, trained: dict) -> None:
    """Put the adapter weights of a train_stage result (fresh or cached) back into every role. A result read from
    the results store has its logs but not its weights: the model is then marked as lacking them (models.withhold),
    so only what the store holds can be read from it."""
    if store.withheld_in(trained["weights"]):
        models.withhold(model, store.missing_weights("a MALT stage"))
        return
    models.release(model)
    for role in ROLES:
        load_adapter_state(model, role, trained["weights"][role])
