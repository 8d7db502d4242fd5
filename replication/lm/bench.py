"""Benchmark (not a test): one full GRPO step, our trainer vs TRL's GRPOTrainer, on the same config.

    python -m replication bench grpo [--reps 3] [--config benchmark|workbook|both] [--json out.json]
    python -m replication bench update [--reps 3] [--config benchmark|workbook]   (both: benchmark)
    python -m replication bench parallel [--reps 3] [--workers 2]   (the workbook config)
    python -m replication bench generate [--n 200] [--batch-size 16]

grpo: each trainer runs in a fresh process (so its peak resident memory is its own), one warm-up step then `reps`
timed steps. Rows: our trainer sampling from a bf16 copy of the policy and updating with bf16 base weights, with and
without two length buckets (GRPOConfig.length_buckets), and all in fp32; TRL in fp32 and in its bf16 mixed
precision; the ratio compares each trainer's fastest row (the fastest median), and both fp32 rows. The update's
achieved FLOP/s is set against a matmul peak measured in the same run in the update's dtype.

parallel: `workers` independent GRPO runs (as a notebook's training seeds are), one after another in this process at
its thread count, against side by side in `workers` processes at one thread each (parallel.run_jobs); the wall
times and their ratio, on the workbook config with the notebooks' bf16 rollout and update.

generate: the notebooks' two generation workloads, ours against transformers' plain generate() on left-padded
batches of 16 (no shared prefill): held-out evaluation (n two-digit sums after three worked examples, greedy, 48
new tokens) and rollouts (16 prompts x G = 8 samples at T = 0.7, 32 new tokens); completion tokens/s, the ratio and
the share of the ceiling these cores allow (2 x parameters FLOP per token at the measured matmul peak).

update: our update phase (forward, backward and AdamW over prompts x G completions of max_new_tokens tokens) and
the reference scoring pass, update_dtype float32 vs bfloat16, interleaved in one process; medians.
"""
import argparse
import multiprocessing
import resource
import statistics
import tempfile
import time

import torch

from replication.core import files
from . import grpo, models, parallel, tasks
from .rollout import Rollout

LORA_R = 16
CONFIGS = {
    # the benchmark config: long sampled replies, a cheap reward, KL on
    "benchmark": {"level": "2d-1step-add", "prompts_per_step": 4, "group_size": 8, "max_new_tokens": 48, "kl_beta": 0.04,
                  "temperature": 1.0, "top_p": 1.0, "reward": "length"},
    # the workbook's real runs: short replies at the notebooks' rollout temperature, the exact verifier
    "workbook": {"level": "1d-1step-add", "prompts_per_step": 4, "group_size": 8, "max_new_tokens": 32, "kl_beta": 0.0,
                 "temperature": 0.7, "top_p": 1.0, "reward": "verifier"},
}


def synchronizer(device):
    """A call that waits for `device`'s queued work (CUDA kernels run asynchronously), so a timer around it is true."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


def matmul_peak(n: int = 2048, reps: int = 10, dtype: str = "float32", device: str = "cpu") -> float:
    """Achieved FLOP/s of a square matmul in `dtype` on `device` (the best of `reps`, after three warm-ups)."""
    a, b = (torch.randn(n, n).to(device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    sync = synchronizer(device)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def reward_fn(kind: str):
    """length: shorter is better (cheap, always mixed); verifier: the exact verifier on the problem's answer."""
    if kind == "length":
        return lambda prompts, completions, metadata=None, **kw: [1.0 / (1.0 + len(c)) for c in completions]
    return tasks.verifier_reward


def problems(cfg: dict):
    return tasks.make_level(cfg["level"], cfg["prompts_per_step"], seed=0)


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def ours(model_name: str, cfg: dict, reps: int, rollout_dtype: str = "float32", update_dtype: str = "float32",
         length_buckets: int = 1) -> dict:
    """Step times of replication.lm.grpo, with the split of the step and the share of zero-gradient groups."""
    torch.manual_seed(0)
    model, tok = models.load_model(model_name)
    model = models.add_lora(model, r=LORA_R, alpha=2 * LORA_R)
    gcfg = grpo.GRPOConfig(num_generations=cfg["group_size"], max_new_tokens=cfg["max_new_tokens"], kl_beta=cfg["kl_beta"],
                           lr=1e-5, temperature=cfg["temperature"], top_p=cfg["top_p"], rollout_dtype=rollout_dtype,
                           update_dtype=update_dtype, length_buckets=length_buckets)
    trainer = grpo.GRPOTrainer(model, tok, reward_fn(cfg["reward"]), gcfg)
    probs = problems(cfg)
    prompts, meta = [p.prompt() for p in probs], [{"answer": p.answer} for p in probs]
    rows = []
    for step in range(reps + 1):  # the first step warms up and is not counted
        t0 = time.perf_counter()
        row = trainer.step(prompts, meta, step=step)
        row["step_s"] = time.perf_counter() - t0
        rows.append(row)
    rows = rows[1:]
    n_prompt = max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in models.chat_prompts(tok, prompts))
    seq = statistics.mean(r["completion_len"] for r in rows)
    # update FLOPs: forward (2N) + backward through the frozen weights (2N) per encoded token: each prompt once per
    # group (prompt sharing) and every completion token; attention and LoRA terms ignored
    tokens = cfg["prompts_per_step"] * n_prompt + cfg["prompts_per_step"] * cfg["group_size"] * seq
    n_params = sum(p.numel() for p in model.parameters())
    backward = statistics.mean(r["backward_s"] for r in rows)
    return {"step_s": [r["step_s"] for r in rows], "seq_len": seq, "prompt_len": n_prompt,
            "split": {k: statistics.mean(r.get(f"{k}_s", 0.0) for r in rows) for k in ("generation", "reward", "scoring", "backward")},
            "completion_tokens": statistics.mean(r["completion_len"] * cfg["prompts_per_step"] * cfg["group_size"]
                                                 for r in rows),
            "zero_std_frac": statistics.mean(r["zero_std_frac"] for r in rows),
            "update_flops": 4 * n_params * tokens / backward, "update_dtype": update_dtype, "peak_gb": peak_gb()}


def trl(model_name: str, cfg: dict, reps: int, bf16: bool = False) -> dict:
    """Step times of TRL's GRPOTrainer on the same config (LoRA through peft_config); bf16=True is TRL's
    mixed-precision setting."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tok = models.load_model(model_name)
    times, lengths, zero = [], [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])
                zero.append(logs.get("frac_reward_zero_std", float("nan")))

    probs = problems(cfg)
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": p.prompt()}] for p in probs] * (reps + 1),
                            "answer": [p.answer for p in probs] * (reps + 1)})
    score = reward_fn(cfg["reward"])
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=cfg["prompts_per_step"] * cfg["group_size"],
                          num_generations=cfg["group_size"],
                          max_completion_length=cfg["max_new_tokens"], beta=cfg["kl_beta"], learning_rate=1e-5,
                          temperature=cfg["temperature"], top_p=cfg["top_p"], loss_type="grpo", epsilon=0.2,
                          max_steps=reps + 1, logging_steps=1, report_to=[], use_cpu=True, bf16=bf16,
                          save_strategy="no", seed=0, dataloader_num_workers=0, disable_tqdm=True, shuffle_dataset=False)
        lora = LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, target_modules=list(models.LORA_TARGETS), task_type="CAUSAL_LM")
        reward = lambda prompts, completions, answer, **kw: score(  # noqa: E731
            prompts, [c[0]["content"] for c in completions], [{"answer": a} for a in answer])
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                              processing_class=tok, peft_config=lora, callbacks=[Clock()])
        trainer.train()
    return {"step_s": times[1:], "seq_len": statistics.mean(lengths[1:]) if len(lengths) > 1 else float("nan"),
            "zero_std_frac": statistics.mean(zero[1:]) if len(zero) > 1 else float("nan"), "peak_gb": peak_gb()}


def _child(args):
    fn, model_name, cfg, reps, threads, option = args
    torch.set_num_threads(threads)
    if fn == "ours":
        return ours(model_name, cfg, reps, *option)
    return trl(model_name, cfg, reps, bf16=option)


def isolated(fn: str, model_name: str, cfg: dict, reps: int, option) -> dict:
    """Run one trainer's timing in a fresh process (its own peak memory, no state shared with the other)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_child, ((fn, model_name, cfg, reps, torch.get_num_threads(), option),))


# (label, trainer, option): ours (rollout_dtype, update_dtype, length_buckets): the fastest setting samples from a
# bf16 copy of the policy, scores and updates with the frozen base weights in bf16 and the completions in two
# length buckets; TRL: its bf16 flag; fp32 rows for both
SETTINGS = [("replication.grpo, bf16 rollout + bf16 update + 2 length buckets", "ours", ("bfloat16", "bfloat16", 2)),
            ("replication.grpo, bf16 rollout + bf16 update", "ours", ("bfloat16", "bfloat16", 1)),
            ("replication.grpo, fp32", "ours", ("float32", "float32", 1)),
            ("TRL 1.16 GRPOTrainer, fp32", "trl", False), ("TRL 1.16 GRPOTrainer, bf16", "trl", True)]


def compare(name: str, model_name: str, reps: int, peak: dict, trl_bf16: bool = True) -> dict:
    cfg = CONFIGS[name]
    rows = {label: isolated(fn, model_name, cfg, reps, opt) for label, fn, opt in SETTINGS
            if trl_bf16 or not (fn == "trl" and opt)}
    med = {k: statistics.median(v["step_s"]) for k, v in rows.items()}
    best = lambda prefix: min((k for k in med if k.startswith(prefix)), key=med.get)  # noqa: E731
    ours_best, trl_best = best("replication"), best("TRL")
    return {"config": name, "settings": cfg, "rows": rows, "median_s": med, "ours_best": ours_best, "trl_best": trl_best,
            "ratio": med[trl_best] / med[ours_best],
            "ratio_fp32": med["TRL 1.16 GRPOTrainer, fp32"] / med["replication.grpo, fp32"],
            "ours_tokens_per_s": rows[ours_best]["completion_tokens"] / med[ours_best], "matmul_peak_flops": peak}


def show(r: dict) -> None:
    c = r["settings"]
    print(f"\n### {r['config']}: {c['level']}, {c['prompts_per_step']} prompts x G={c['group_size']}, {c['max_new_tokens']} new tokens, "
          f"T={c['temperature']}, top_p={c['top_p']}, KL beta={c['kl_beta']}, reward: {c['reward']}, LoRA r={LORA_R}")
    print("\n| trainer | median step (s) | steps (s) | mean completion length | zero-gradient groups | peak memory (GB) |")
    print("|---|---|---|---|---|---|")
    for label, x in r["rows"].items():
        print(f"| {label} | {r['median_s'][label]:.1f} | {', '.join(f'{s:.1f}' for s in x['step_s'])} | "
              f"{x['seq_len']:.1f} | {x['zero_std_frac']:.2f} | {x['peak_gb']:.1f} |")
    print(f"\nratio, each at its fastest ({r['trl_best']} / {r['ours_best']}): {r['ratio']:.2f}x; both fp32: {r['ratio_fp32']:.2f}x")
    print(f"our completion tokens/s (whole step, fastest setting): {r['ours_tokens_per_s']:.1f}")
    for label, x in r["rows"].items():
        if "split" in x:
            print(f"{label}: split (s) " + ", ".join(f"{k} {v:.1f}" for k, v in x["split"].items()) +
                  f"; update ~{x['update_flops'] / 1e9:.1f} GFLOP/s vs the {x['update_dtype']} matmul peak "
                  f"{r['matmul_peak_flops'][x['update_dtype']] / 1e9:.1f} GFLOP/s "
                  f"({100 * x['update_flops'] / r['matmul_peak_flops'][x['update_dtype']]:.0f}%; the update's frozen "
                  f"matmuls run in {x['update_dtype']}, LoRA and attention in fp32)")


def update_phase(model_name: str, cfg: dict, reps: int, dtypes=("float32", "bfloat16")) -> dict:
    """Seconds of our update phase (forward + backward + AdamW over prompts x G completions of max_new_tokens
    tokens, all unmasked, kl_beta as in cfg) and of the reference scoring pass, for each update_dtype, interleaved
    in one process after one warm-up of each: {"update": {dtype: [wall s, ...]}, "update_cpu": {dtype: [CPU s,
    ...]}, "scoring": ..., "scoring_cpu": ..., "median": {phase: {dtype: s}}}."""
    torch.manual_seed(0)
    model, tok = models.load_model(model_name)
    model = models.add_lora(model, r=LORA_R, alpha=2 * LORA_R)
    G, T = cfg["group_size"], cfg["max_new_tokens"]
    texts = models.chat_prompts(tok, [p.prompt() for p in problems(cfg)])
    dev = models.device_of(model)
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(dev)
    p_ids, p_mask = enc["input_ids"].repeat_interleave(G, 0), enc["attention_mask"].repeat_interleave(G, 0)
    c_ids = torch.randint(0, len(tok), (len(p_ids), T)).to(dev)
    batch = Rollout(p_ids, p_mask, c_ids, torch.ones_like(c_ids), [""] * len(p_ids), torch.randn(len(p_ids)).to(dev), G)
    batch.advantages = torch.randn(len(p_ids)).to(dev)
    trainers = {d: grpo.GRPOTrainer(model, tok, None, grpo.GRPOConfig(num_generations=G, max_new_tokens=T, lr=1e-5,
                                                                      kl_beta=cfg["kl_beta"], update_dtype=d))
                for d in dtypes}

    def score(t):
        with torch.no_grad(), t.precision(), model.disable_adapter():
            batch.ref_logps = t._logps(batch) if cfg["kl_beta"] > 0 else None

    sync = synchronizer(dev)

    def clocked(fn, t):  # wall seconds, and this process's CPU seconds (all threads): steadier on a shared machine
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        fn(t)
        sync()
        return time.perf_counter() - t0, time.process_time() - c0

    out = {f"{kind}{clock}": {d: [] for d in dtypes} for kind in ("scoring", "update") for clock in ("", "_cpu")}
    for rep in range(reps + 1):  # the first round warms up and is not counted
        for d, t in trainers.items():
            for kind, fn in (("scoring", score), ("update", lambda t: t.update(batch))):
                wall, cpu = clocked(fn, t)
                if rep:
                    out[kind][d].append(wall)
                    out[f"{kind}_cpu"][d].append(cpu)
    out["median"] = {phase: {d: statistics.median(v) for d, v in x.items()} for phase, x in list(out.items())}
    return out


def parallel_runs(model_name: str, cfg: dict, reps: int, workers: int = 2) -> dict:
    """Wall seconds of `workers` GRPO runs of reps + 1 steps each: sequential in this process (its threads), then in
    `workers` processes at one thread each; and sequential / parallel; in the notebooks' `auto` precision."""
    dtype = models.resolve_dtype("rollout_dtype", "auto")
    job = {"model_name": model_name, "cfg": cfg, "reps": reps, "rollout_dtype": dtype, "update_dtype": dtype}
    t0 = time.perf_counter()
    seq, t1 = parallel.run_jobs(ours, [job] * workers, workers=1), time.perf_counter()
    par, t2 = parallel.run_jobs(ours, [job] * workers, workers=workers), time.perf_counter()
    step = {k: [r["step_s"] for r in rs] for k, rs in (("sequential_step_s", seq), ("parallel_step_s", par))}
    mean = {k: statistics.mean(sum(v, [])) for k, v in step.items()}   # a steady step, over every run
    return {"threads": torch.get_num_threads(), "workers": workers, "dtype": dtype, "sequential_s": t1 - t0, "parallel_s": t2 - t1,
            "ratio": (t1 - t0) / (t2 - t1), **step, "throughput": workers * mean["sequential_step_s"] / mean["parallel_step_s"]}


def plain_generate(model, tok, texts, max_new_tokens: int, batch_size: int = 16, temperature: float = 0.0,
                   repeats: int = 1, seed: int = 0) -> list:
    """The baseline: transformers' generate() on left-padded batches of templated texts (each repeated `repeats`
    times in the batch), no shared prefill. Returns the completion token ids of every row, prompt-major."""
    from transformers import GenerationConfig

    rows = [t for t in texts for _ in range(repeats)]
    sample = temperature > 0
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature if sample else None,
                           top_p=None, top_k=None, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    out = []
    for b, i in enumerate(range(0, len(rows), batch_size)):
        torch.manual_seed(seed + b)
        enc = tok(rows[i:i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False).to(models.device_of(model))
        with torch.no_grad():
            seqs = model.generate(**enc, generation_config=cfg)
        completion = seqs[:, enc["input_ids"].shape[1]:]
        mask = models.completion_mask(completion, tok.eos_token_id)
        out += [c[m.bool()].tolist() for c, m in zip(completion, mask)]
    return out


def generation(model_name: str, n: int = 200, batch_size: int = 16) -> dict:
    """Tokens/s of both workloads (module docstring), ours vs the plain path, with the fp32 ceiling."""
    model, tok = models.load_model(model_name)
    shots = tasks.worked_examples("2d-1step-add", 3, seed=0)
    heldout = tasks.make_level("2d-1step-add", n, seed=1)
    texts = models.chat_prompts(tok, [p.chat(shots) for p in heldout])
    rollout = models.chat_prompts(tok, [p.chat(shots) for p in heldout[:16]])
    out = {}
    for name, kw in {"evaluation": {"texts": texts, "max_new_tokens": 48, "temperature": 0.0, "repeats": 1},
                     "rollout": {"texts": rollout, "max_new_tokens": 32, "temperature": 0.7, "repeats": 8}}.items():
        t0 = time.perf_counter()
        ours_gen = models.generate(model, tok, kw["texts"], kw["max_new_tokens"], kw["temperature"], batch_size=batch_size,
                                   chat=False, repeats=kw["repeats"])
        t1 = time.perf_counter()
        plain = plain_generate(model, tok, kw["texts"], kw["max_new_tokens"], batch_size, kw["temperature"], kw["repeats"])
        t2 = time.perf_counter()
        ours_tps, plain_tps = ours_gen.num_tokens / (t1 - t0), sum(map(len, plain)) / (t2 - t1)
        out[name] = {"ours_tokens_per_s": ours_tps, "plain_tokens_per_s": plain_tps, "ratio": ours_tps / plain_tps,
                     "ours_s": t1 - t0, "plain_s": t2 - t1, "same_greedy_outputs": (
                         ours_gen.completion_ids == plain if kw["temperature"] == 0 else None)}
    n_params = sum(p.numel() for p in model.parameters())
    device = models.device_of(model)
    peak = matmul_peak(dtype="float32", device=device)
    return {"workloads": out, "ceiling_tokens_per_s": peak / (2 * n_params), "matmul_peak_flops": peak,
            "threads": torch.get_num_threads(), "n": n, "batch_size": batch_size, "device": str(device)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replication bench")
    ap.add_argument("what", choices=["grpo", "update", "parallel", "generate"],
                    help="grpo: full steps, ours vs TRL; update: our update and scoring phases, fp32 vs bf16; "
                         "parallel: independent runs one after another vs side by side at one thread each; "
                         "generate: evaluation and rollout generation, ours vs plain generate()")
    ap.add_argument("--n", type=int, default=200, help="generate: held-out questions (default 200)")
    ap.add_argument("--batch-size", type=int, default=16, help="generate: rows per batch (default 16)")
    ap.add_argument("--workers", type=int, default=2, help="parallel: runs side by side (default 2)")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per trainer (after one warm-up step)")
    ap.add_argument("--config", default="both", choices=[*CONFIGS, "both"])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--device", default="cpu", help="generate and update: cpu (default), auto, cuda or cuda:N")
    ap.add_argument("--no-trl-bf16", action="store_true", help="skip TRL's bf16 row (it is slower than fp32 on this CPU)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps {args.reps} is not allowed; it must be >= 1")
    if args.device != "cpu":
        if args.what not in ("generate", "update"):
            ap.error(f"--device {args.device} is allowed only with generate and update (grpo and parallel run on the CPU)")
        try:
            models.use_device(args.device)
        except ValueError as e:
            ap.error(str(e))
    if args.what == "generate":
        r = generation(args.model, args.n, args.batch_size)
        print(f"{r['device']}, {r['threads']} threads, batch {r['batch_size']}; ceiling at the fp32 matmul peak "
              f"({r['matmul_peak_flops'] / 1e9:.0f} GFLOP/s): {r['ceiling_tokens_per_s']:.0f} tokens/s")
        for name, w in r["workloads"].items():
            same = "" if w["same_greedy_outputs"] is None else f"; greedy outputs identical: {w['same_greedy_outputs']}"
            print(f"{name}: ours {w['ours_tokens_per_s']:.0f} tokens/s ({w['ours_s']:.1f} s), plain generate() "
                  f"{w['plain_tokens_per_s']:.0f} tokens/s ({w['plain_s']:.1f} s): {w['ratio']:.2f}x; "
                  f"{100 * w['ours_tokens_per_s'] / r['ceiling_tokens_per_s']:.1f}% of the ceiling{same}")
        if args.json:
            files.write_json(args.json, {"date": time.strftime("%Y-%m-%d"), **r})
        return 0
    if args.what == "parallel":
        r = parallel_runs(args.model, CONFIGS["workbook"], args.reps, args.workers)
        print(f"{r['workers']} GRPO runs of {args.reps + 1} steps (workbook config, {r['dtype']} rollout and update): one after another "
              f"at {r['threads']} threads {r['sequential_s']:.1f} s; side by side at 1 thread each {r['parallel_s']:.1f} s; "
              f"sequential / parallel = {r['ratio']:.2f}x; throughput of a steady step {r['throughput']:.2f}x")
        if args.json:
            files.write_json(args.json, {"date": time.strftime("%Y-%m-%d"), **r})
        return 0
    if args.what == "update":
        name = "benchmark" if args.config == "both" else args.config
        c = CONFIGS[name]
        print(f"{torch.get_num_threads()} threads, {args.reps} interleaved rounds after one warm-up; {name} config: "
              f"{c['prompts_per_step']} prompts x G={c['group_size']}, {c['max_new_tokens']} completion tokens, KL beta={c['kl_beta']}")
        r = update_phase(args.model, c, args.reps)
        for phase in ("update", "update_cpu", "scoring", "scoring_cpu"):
            for d, xs in r[phase].items():
                print(f"{phase} {d}: median {r['median'][phase][d]:.2f} s ({', '.join(f'{x:.2f}' for x in xs)})")
            if len(r[phase]) == 2:
                print(f"{phase}: float32 / bfloat16 = {r['median'][phase]['float32'] / r['median'][phase]['bfloat16']:.2f}x")
        if args.json:

            files.write_json(args.json, {"date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(),
                                         "config": name, "settings": c, **r})
        return 0
    print(f"{torch.get_num_threads()} threads, {args.reps} timed steps per trainer after one warm-up, "
          f"each trainer in its own process")
    peak = {d: matmul_peak(dtype=d) for d in ("float32", "bfloat16")}
    print("matmul peak (2048 x 2048, best of 10): " + ", ".join(f"{d} {f / 1e9:.0f} GFLOP/s" for d, f in peak.items()))
    results = []
    for name in (CONFIGS if args.config == "both" else [args.config]):
        results.append(compare(name, args.model, args.reps, peak, trl_bf16=not args.no_trl_bf16))
        show(results[-1])
    if args.json:

        files.write_json(args.json, {"date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), "results": results})
    return 0
