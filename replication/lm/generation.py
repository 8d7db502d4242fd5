"""Generation from a (LoRA) causal LM: chat prompts, prompt encoding with a shared prefill, sampling, and greedy
decoding that drops finished rows.

`generate` is the one batched entry point (greedy when temperature == 0, `repeats` samples per prompt from one
shared prefill); `sample` is one batch of it, on already templated texts."""
import time
from dataclasses import dataclass, field

import torch

from replication.core import config

def chat_prompts(tok, prompts, system=None):
    """Apply the chat template to prompts (a user message, or a list of chat messages), ending with the assistant's turn."""
    out = []
    for p in prompts:
        turns = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
        messages = ([{"role": "system", "content": system}] if system else []) + turns
        out.append(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return out


@dataclass
class Generation:
    """Completions of one generate() call, with token counts and wall time."""

    texts: list
    completion_ids: list = field(repr=False)
    seconds: float = 0.0

    @property
    def num_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)


def device_of(model) -> torch.device:
    """Where the model's weights are: the device every input built for it is put on."""
    return next(model.parameters()).device


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids under left padding, as generate() assigns them (the first real token is position 0)."""
    return (attention_mask.cumsum(1) - 1).clamp(min=0)


MIN_SHARED = 32  # tokens: a shorter leading run that prompts share is not worth a pass of its own


def common_prefix(prompt_ids, prompt_mask) -> int:
    """Length of the longest run of leading tokens that every prompt shares (its real tokens, padding skipped)."""
    rows = [ids[m.bool()] for ids, m in zip(prompt_ids, prompt_mask)]
    n = min(len(r) for r in rows)
    same = torch.stack([r[:n] for r in rows]).eq(rows[0][:n]).all(0)
    return int(n if bool(same.all()) else same.long().argmin())


def encode_prompts(model, prompt_ids, prompt_mask, min_prefix: int = MIN_SHARED):
    """Encode distinct prompts for continuations: (logits of each prompt's last position (U, 1, V), the keys and
    values (a cache of U rows), the ids and attention mask in the cache's layout (what continuations extend), the
    number of real tokens of each prompt (the next token's position)).

    Prompts that share a leading run of >= min_prefix tokens (a system turn and the same worked examples before
    each question) encode it once: the shared run, then each prompt's rest, left-padded after the shared run (the
    padding masked), with the gradient flowing through both. Otherwise the prompts are encoded as given (left
    padding). Same values as encoding each prompt whole, up to rounding."""
    U, lengths = prompt_ids.shape[0], prompt_mask.sum(1)
    L = common_prefix(prompt_ids, prompt_mask) if U > 1 else 0
    L = min(L, int(lengths.min()) - 1) if L >= min_prefix else L  # each prompt keeps a token of its own
    if L < min_prefix:
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids(prompt_mask),
                    use_cache=True, logits_to_keep=1)
        return out.logits[:, -1:], out.past_key_values, prompt_ids, prompt_mask, lengths
    rows = [ids[m.bool()] for ids, m in zip(prompt_ids, prompt_mask)]
    rest = max(len(r) for r in rows) - L
    ids = torch.full((U, rest), int(rows[0][L]), dtype=prompt_ids.dtype, device=prompt_ids.device)  # filler, 0 mask
    mask = torch.zeros((U, rest), dtype=prompt_mask.dtype, device=prompt_mask.device)
    for u, r in enumerate(rows):
        ids[u, rest - len(r) + L:], mask[u, rest - len(r) + L:] = r[L:], 1
    shared = model(input_ids=rows[0][None, :L], use_cache=True, logits_to_keep=1).past_key_values
    shared.batch_repeat_interleave(U)
    attention = torch.cat([torch.ones((U, L), dtype=mask.dtype, device=mask.device), mask], 1)
    positions = (L + mask.cumsum(1) - 1).clamp(min=L)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=shared,
                use_cache=True, logits_to_keep=1)
    return out.logits[:, -1:], out.past_key_values, torch.cat([rows[0][None, :L].expand(U, -1), ids], 1), attention, lengths


def sample(model, tok, texts, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, repeats: int = 1,
           top_k: int = 0, min_p: float = 0.0):
    """`repeats` completions per (already templated) text, text-major: prompt ids and mask, completion ids and mask.

    The prompts are prefilled before generate() (encode_prompts) when they come with repeats or share a
    leading run (the same worked examples before each question): each prompt once, its KV cache copied for the
    repeats, and a shared leading run once for all prompts; on a CPU the prefill of long prompts costs more than
    decoding a short reply. The prompt ids and mask returned are in that cache's layout (padding after the shared
    run rather than before it); their real tokens are the same."""
    from transformers import GenerationConfig

    enc = tok(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    prefill = (ids.shape[1] > 1 and bool(mask[:, :-1].any(1).all()) and (repeats > 1 or len(ids) > 1)
               and (repeats > 1 or common_prefix(ids, mask) >= MIN_SHARED))  # decided on the CPU copies
    ids, mask = ids.to(device_of(model)), mask.to(device_of(model))
    do_sample = temperature > 0
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=do_sample, top_k=(top_k or None) if do_sample else None,
                           temperature=temperature if do_sample else None, top_p=top_p if do_sample else None,
                           min_p=(min_p or None) if do_sample else None,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    extra = {}
    with torch.no_grad():
        if prefill:   # the last prompt token is left for generate() to feed
            _, cache, head, head_mask, _ = encode_prompts(model, ids[:, :-1], mask[:, :-1])
            cache.batch_repeat_interleave(repeats)
            ids, mask = torch.cat([head, ids[:, -1:]], 1), torch.cat([head_mask, mask[:, -1:]], 1)
            extra = {"past_key_values": cache}
        ids, mask = ids.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0)
        warp = warpers(model, cfg) if do_sample else None
        if do_sample and warp is None:   # a processor that reads the ids so far: transformers' own loop
            completion = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg, **extra)[:, ids.shape[1]:]
        else:
            completion = decode(model, ids, mask, max_new_tokens, tok.eos_token_id, tok.pad_token_id,
                                extra.get("past_key_values"), warp)
    return ids, mask, completion, completion_mask(completion, tok.eos_token_id)


ROW_FREE = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper")


def warpers(model, cfg):
    """The logits processors generate() applies for a sampling config (its unset fields filled as generate() fills
    them: from the model's generation config, then transformers' defaults, so an unset top_k is 50), or None when one
    of them reads more than its row's scores (then `decode` cannot reproduce generate())."""
    full, _ = model._prepare_generation_config(cfg)
    procs = model._get_logits_processor(generation_config=full, device=device_of(model), model_kwargs={})
    return procs if all(type(p).__name__ in ROW_FREE for p in procs) else None


def decode(model, ids, mask, max_new_tokens: int, eos_id: int, pad_id: int, cache=None, warp=None) -> torch.Tensor:
    """generate()'s completions (B, steps), pad after EOS, computed on the unfinished rows only: a row that has
    emitted EOS leaves the batch (and its KV cache) at once, so a batch costs the sum of its reply lengths rather
    than its longest reply times its rows. Greedy when `warp` is None; else sampled from warp's scores as generate()
    samples, with the same draws: the scores of all B rows are kept (finished rows flat), because
    torch.multinomial draws one exponential per row and vocabulary entry, so every row's draw depends on the batch's
    shape, not on the other rows' values. `cache` holds all but the last token of `ids` (sample's prefill), or None.
    Each step mirrors generate(): positions from the attention mask, the last position's logits in fp32."""
    B = ids.shape[0]
    rows = torch.arange(B, device=ids.device)
    out = torch.full((B, max_new_tokens), pad_id, dtype=ids.dtype, device=ids.device)
    if cache is None:
        step, pos = ids, position_ids(mask).masked_fill(mask == 0, 1)
    else:
        step, pos = ids[:, -1:], mask.sum(1, keepdim=True) - 1
    steps = 0
    for t in range(max_new_tokens):
        o = model(input_ids=step, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                  logits_to_keep=1)
        cache, logits = o.past_key_values, o.logits[:, -1].float()       # (active, V)
        if warp is None:
            nxt = logits.argmax(-1)
        else:
            scores = logits.new_zeros((B, logits.shape[1]))
            scores[rows] = logits
            nxt = torch.multinomial(torch.softmax(warp(out[:, :t], scores), -1), num_samples=1).squeeze(1)[rows]
        out[rows, t], steps = nxt, t + 1
        done = nxt == eos_id
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, nxt, mask = rows[keep], nxt[keep], mask[keep]
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], 1)
        step, pos = nxt[:, None], mask.sum(1, keepdim=True) - 1
    return out[:, :steps]


def completion_mask(completion: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for tokens up to and including the first EOS of each row, 0 after it."""
    is_eos = completion == eos_id
    no_eos = torch.full_like(is_eos[:, 0], completion.shape[1], dtype=torch.long)
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), no_eos)
    return (torch.arange(completion.shape[1], device=completion.device)[None, :] <= first[:, None]).long()


def generate(model, tok, prompts, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0, batch_size: int = 16, chat: bool = True, system=None, progress: bool = False,
             repeats: int = 1):
    """Batched, left-padded, seeded generation; greedy when temperature == 0; `repeats` samples per prompt,
    prompt-major (prompt i's samples are rows i * repeats ... i * repeats + repeats - 1), sharing one prefill."""
    from tqdm.auto import tqdm

    config.check_int("max_new_tokens", max_new_tokens)
    config.check_int("batch_size", batch_size)
    config.check_int("repeats", repeats)
    config.check_range("temperature", temperature, 0.0, 10.0)
    texts = chat_prompts(tok, prompts, system) if chat else list(prompts)
    out_texts, out_ids, t0 = [], [], time.perf_counter()
    per_batch = max(1, batch_size // repeats)   # distinct prompts per batch: about batch_size rows
    starts = range(0, len(texts), per_batch)
    for b, i in enumerate(tqdm(starts, desc="generate", disable=not progress)):
        torch.manual_seed(config.derive_seed(seed, "generate", b))
        _, _, ids, mask = sample(model, tok, texts[i:i + per_batch], max_new_tokens, temperature, top_p, repeats)
        for row, m in zip(ids, mask):
            out_ids.append(row[m.bool()].tolist())
            out_texts.append(tok.decode(out_ids[-1], skip_special_tokens=True))
    return Generation(out_texts, out_ids, time.perf_counter() - t0)
