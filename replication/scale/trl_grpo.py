"""The methods as pieces of TRL's GRPOTrainer, for runs past one machine (`accelerate launch`, DeepSpeed, vLLM).

Every reward is the workbook's own function; this module only adapts it to TRL's reward signature
`f(prompts, completions, **columns, trainer_state=, log_metric=, log_extra=)` and to several processes:
- EloReward: Elo-Evolve's win/loss reward (judging.outcomes: the judge and the length rule) against an opponent drawn
  per prompt by the Elo temperature rule (elo.sampling_probs); the policy's rating moves once per generation batch
  (elo.update) over the outcomes gathered from every process, so all ranks hold the same rating.
- RLPRReward and RLPRTrainer: RLPR's probability reward (rlpr.Reward) scored by the trainer's own policy, and the
  adaptive std filter (rlpr_training.StdFilter) on the gathered group rewards. A dropped group gets no loss term
  (its rewards NaN, TRL's "unscorable" rows, and its completion mask zero); TRL's batch is fixed, so it is not
  refilled as the workbook's loop does.
- SaveState: writes a reward's or filter's state into each TRL checkpoint; `load_state` reads it back on resume.
The `python -m replication train` command (replication.scale.train) builds these from a YAML config.
"""
import json
from pathlib import Path

import numpy as np
import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import TrainerCallback
from trl import GRPOTrainer

from replication.core import config
from replication.lm import elo
from replication.papers.elo_evolve import judging
from replication.papers.rlpr import rlpr, rlpr_training

STATE_FILE = "replication_state.json"


def texts(completions) -> list:
    """Completion strings from TRL's completions (plain strings, or conversational [{"role", "content"}])."""
    return [c[-1]["content"] if isinstance(c, list) else c for c in completions]


def chat(prompt) -> list:
    """A prompt (a user message or chat turns, as Problem.chat / Question.chat give) as TRL's conversational prompt."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


class EloReward:
    """Elo-Evolve's reward for TRL: the dataset's `index` column names the problem (its row in every opponent's
    cached responses), `question` and `answer` go to the judge. The opponent of problem i at step t is drawn from
    elo.sampling_probs with a generator seeded by (seed, t, i), so the G completions of a prompt meet the same
    opponent on whichever process they are. The judge's noise is seeded by (seed, t, process)."""

    __name__ = "elo_evolve"

    def __init__(self, judge, pool: dict, ratings, temperature: float = 200.0, k: float = 32.0,
                 update_rule: str = "mean", start_rating: float = 1350.0, length_margin: int = 60, seed: int = 0):
        self.names, self.pool = list(pool), pool
        self.ratings = np.asarray(ratings, float)
        if len(self.ratings) != len(self.names):
            raise ValueError(f"ratings has {len(self.ratings)} entries for {len(self.names)} opponents")
        config.check_choice("update_rule", update_rule, elo.UPDATE_RULES)
        config.check_int("length_margin", length_margin, minimum=0)
        config.check_int("seed", seed, minimum=0)
        elo.sampling_probs(start_rating, self.ratings, temperature)  # checks the temperature
        self.judge, self.temperature, self.k, self.update_rule = judge, float(temperature), float(k), update_rule
        self.length_margin, self.seed = length_margin, seed
        self.rating, self.calls, self.seen = float(start_rating), 0, []

    def probs(self) -> np.ndarray:
        """p(M_k | pi) at the current rating."""
        return elo.sampling_probs(self.rating, self.ratings, self.temperature)

    def opponents(self, index, step: int) -> list:
        """The opponent (an index into the pool) of each problem index at this step."""
        p = self.probs()
        return [int(np.random.default_rng(config.derive_seed(self.seed, "elo-opponent", step, int(i))).choice(len(p), p=p))
                for i in index]

    def __call__(self, prompts, completions, index, question, answer, trainer_state=None, log_metric=None,
                 log_extra=None, **kwargs):
        step = self.calls if trainer_state is None else trainer_state.global_step
        probs, opp = self.probs(), self.opponents(index, step)
        rng = np.random.default_rng(config.derive_seed(self.seed, "judge", step, PartialState().process_index))
        s = judging.outcomes(self.judge, question, answer, texts(completions),
                            [self.pool[self.names[o]][i] for o, i in zip(opp, index)], rng, self.length_margin)
        self.seen.extend(int(i) for i in dict.fromkeys(index))
        everyone, their_opp = gather_object(s.tolist()), gather_object(opp)  # every process's matches, rank order
        self.rating = elo.update(self.rating, everyone, self.ratings[their_opp], self.k, self.update_rule)
        self.calls += 1
        if log_metric is not None:
            log_metric("elo/rating", self.rating)
            log_metric("elo/win_rate", float(np.mean(everyone)))
            for name, p in zip(self.names, probs):
                log_metric(f"elo/p/{name}", float(p))
        if log_extra is not None:
            log_extra("opponent", [self.names[o] for o in opp])
            log_extra("outcome", s.tolist())
        return s.tolist()

    def state_dict(self) -> dict:
        return {"rating": self.rating, "calls": self.calls, "names": self.names, "ratings": self.ratings.tolist()}

    def load_state_dict(self, state: dict) -> None:
        if state["names"] != self.names:
            raise ValueError(f"the checkpoint's opponents {state['names']} are not this pool's {self.names}")
        self.rating, self.calls = float(state["rating"]), int(state["calls"])


class RLPRReward:
    """RLPR's reward for TRL (rlpr.Reward over the dataset's id, reference, aliases and value columns), scored by
    the policy the trainer holds at the call (set by RLPRTrainer)."""

    __name__ = "rlpr"

    def __init__(self, reward: rlpr.Reward):
        self.reward, self.trainer, self.seen = reward, None, []

    def __call__(self, prompts, completions, id, reference, aliases, value, log_metric=None, log_extra=None,
                 **kwargs):
        if self.trainer is not None:
            self.reward.model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        meta = [{"id": q, "reference": r, "aliases": a, "value": v} for q, r, a, v in zip(id, reference, aliases, value)]
        self.seen.extend(dict.fromkeys(id))
        training = self.reward.model.training  # scoring switches to eval mode; TRL's loss reads the mode after it
        try:
            return self.reward(prompts, texts(completions), meta, log_metric=log_metric, log_extra=log_extra)
        finally:
            self.reward.model.train(training)


class RLPRTrainer(GRPOTrainer):
    """GRPOTrainer with RLPR's adaptive std filter: prompts whose gathered group reward std falls below
    beta x EMA carry no loss term; the filter sees each generation batch's mean group std (its step is the
    trainer's global step). RLPRReward functions among reward_funcs score with this trainer's policy."""

    def __init__(self, *args, std_filter: rlpr_training.StdFilter = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.std_filter, self.dropped = std_filter, None
        for f in self.reward_funcs:
            if isinstance(f, RLPRReward):
                f.trainer = self

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        training = self.model.training
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # every process's
        self.dropped = None
        if self.std_filter is None or not training:
            return rewards
        G = self.num_generations
        total = (rewards * self.reward_weights.to(rewards.device)).nansum(1)  # TRL's sum over reward functions
        stds = total.view(-1, G).std(1).cpu().numpy()
        threshold = self.std_filter.threshold
        keep = self.std_filter.keep(stds)
        self.std_filter.observe(self.state.global_step, float(stds.mean()))
        self.dropped = torch.from_numpy(~keep).repeat_interleave(G).to(rewards.device)
        self._metrics["train"]["rlpr/fraction_filtered"].append(float(1 - keep.mean()))
        self._metrics["train"]["rlpr/threshold"].append(float("nan") if threshold is None else threshold)
        rewards[self.dropped] = torch.nan
        return rewards

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.dropped is not None:
            n = len(out["completion_mask"])
            rows = self.dropped[self.accelerator.process_index * n:(self.accelerator.process_index + 1) * n]
            out["completion_mask"] = out["completion_mask"] * (~rows).to(out["completion_mask"].dtype)[:, None]
        return out

    def state_dict(self) -> dict:
        return {} if self.std_filter is None else {"filter": self.std_filter.state()}

    def load_state_dict(self, state: dict) -> None:
        if self.std_filter is not None:
            self.std_filter.load(state.get("filter") or {})


class SaveState(TrainerCallback):
    """Writes {name: part.state_dict()} to STATE_FILE in each checkpoint folder (the main process only)."""

    def __init__(self, **parts):
        self.parts = parts

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / STATE_FILE).write_text(json.dumps({k: p.state_dict() for k, p in self.parts.items()}, indent=1))
        return control


def load_state(checkpoint, **parts) -> None:
    """Restore each named part from a checkpoint folder written with SaveState."""
    saved = json.loads((Path(checkpoint) / STATE_FILE).read_text())
    for name, part in parts.items():
        part.load_state_dict(saved[name])
