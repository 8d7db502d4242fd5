"""Shared training pieces: completion log-probs, the optimizer step, encoding pairs, a phase timer."""
import time
from contextlib import contextmanager

import torch

from replication.core import phases
from . import models
from .loop import trainable


def token_logps(logits, ids, temperature: float = 1.0, chunk: int = 8):
    """log softmax(logits / temperature) at ids, shape (B, T), in fp32, a few rows at a time so that no second
    full-vocabulary copy of the logits (scaled, upcast, or their softmax) is held at once."""
    out = []
    for lg, ix in zip(logits.split(chunk), ids.split(chunk)):
        lg = lg.float()  # bf16 logits (LowPrecisionBase) are upcast a chunk at a time; a no-op for fp32
        if temperature != 1.0:
            lg = lg / temperature
        out.append(lg.gather(-1, ix.unsqueeze(-1)).squeeze(-1) - lg.logsumexp(-1))
    return torch.cat(out)


def completion_logps(model, prompt_ids, prompt_mask, completion_ids, mask, temperature: float = 1.0):
    """Per-token log-probs of the completion tokens only, shape (B, T); logits for prompt positions are skipped."""
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention = torch.cat([prompt_mask, mask], 1)
    positions = models.position_ids(attention)
    T = completion_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                   logits_to_keep=T + 1, use_cache=False).logits[:, :-1]  # (B, T, V)
    return token_logps(logits, completion_ids, temperature)


def length_buckets(lengths, buckets: int) -> list:
    """Rows cut into at most `buckets` runs of similar completion length, each run padded only to its own longest
    row: the rows sorted by length, the cuts placed to compute the fewest (row x width) positions (exact dynamic
    programming over the cut points). Returns a list of (row indices, width)."""
    order = sorted(range(len(lengths)), key=lambda i: (int(lengths[i]), i))
    n, k = len(order), max(1, min(buckets, len(order)))
    width = [max(1, int(lengths[i])) for i in order]           # non-decreasing: a run's width is its last row's
    best = [[0.0] + [float("inf")] * n] + [[float("inf")] * (n + 1) for _ in range(k)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    for j in range(1, k + 1):
        for end in range(1, n + 1):
            for start in range(end):
                cost = best[j - 1][start] + (end - start) * width[end - 1]
                if cost < best[j][end]:
                    best[j][end], cut[j][end] = cost, start
    j = min(range(1, k + 1), key=lambda j: (best[j][n], j))    # fewest runs among the cheapest
    out, end = [], n
    while end:
        start = cut[j][end]
        out.append((order[start:end], width[end - 1]))
        end, j = start, j - 1
    return out[::-1]


def _select(cache, rows):
    """A cache holding the given batch rows of `cache` (which is left as it is), the gradient flowing back."""
    import copy

    sub = copy.copy(cache)
    sub.layers = [copy.copy(layer) for layer in cache.layers]
    sub.batch_select_indices(rows)
    return sub


def shared_prompt_logps(model, prompt_ids, prompt_mask, which, completion_ids, mask, temperature: float = 1.0,
                        buckets: int = 1):
    """Completion-token log-probs, shape (B, T), for completions that share prompts: the distinct prompts
    (prompt_ids, left-padded, U rows) are encoded once (models.encode_prompts: a leading run they all share, such
    as a system turn or the same worked examples, once for all) and row b continues prompt which[b], its keys and
    values selected from the prompts' cache with the gradient flowing back through them into the prompts' pass.
    Same values as one pass over each prompt + completion (completion_logps), up to rounding.

    buckets > 1: the completions run in up to that many passes of similar length (length_buckets), each only as
    wide as its longest row, so that a short reply beside a long one costs its own length; the log-probs past a
    row's bucket width (padding under mask 0) are 0."""
    first, cache, _, p_att, lengths = models.encode_prompts(model, prompt_ids, prompt_mask)
    which = torch.as_tensor(which, device=lengths.device)
    T = completion_ids.shape[1]
    if buckets > 1 and T > 1:
        parts = length_buckets(mask.sum(1).tolist(), buckets)
        if len(parts) > 1:
            out = torch.zeros(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)
            for rows, width in parts:
                rows = torch.tensor(rows, device=completion_ids.device)
                out[rows, :width] = _continue(model, first, _select(cache, which[rows]), p_att, lengths, which[rows],
                                              completion_ids[rows, :width], mask[rows, :width], temperature)
            return out
    cache.batch_select_indices(which)                                        # (B, heads, P, d) per layer
    return _continue(model, first, cache, p_att, lengths, which, completion_ids, mask, temperature)


def _continue(model, first, cache, p_att, lengths, which, completion_ids, mask, temperature):
    """shared_prompt_logps' completion pass: rows continue prompts `which` from `cache` (already those rows)."""
    first = first[which]                                                     # predicts completion token 0
    T = completion_ids.shape[1]
    if T == 1:
        return token_logps(first, completion_ids, temperature)
    attention = torch.cat([p_att[which], mask[:, :-1]], 1)
    positions = lengths[which][:, None] + torch.arange(T - 1, device=lengths.device)[None, :]
    rest = model(input_ids=completion_ids[:, :-1], attention_mask=attention, position_ids=positions,
                 past_key_values=cache, use_cache=True).logits                # predicts tokens 1..T-1
    return token_logps(torch.cat([first, rest], 1), completion_ids, temperature)


def grouped_logps(model, prompt_ids, prompt_mask, completion_ids, mask, group_size: int, temperature: float = 1.0,
                  buckets: int = 1):
    """completion_logps for rows that come in groups of `group_size` sharing one prompt (GRPO's G samples):
    each prompt is encoded once (shared_prompt_logps, with its length buckets), its keys and values repeated for
    the group's completions. Same result as completion_logps up to rounding (0 past a bucket's width)."""
    G, B = group_size, completion_ids.shape[0]
    if G == 1 or B % G:
        return completion_logps(model, prompt_ids, prompt_mask, completion_ids, mask, temperature)
    which = torch.arange(B // G).repeat_interleave(G)
    return shared_prompt_logps(model, prompt_ids[::G], prompt_mask[::G], which, completion_ids, mask, temperature, buckets)


def optimizer_step(model, optimizer, max_grad_norm: float) -> float:
    """Clip the trainable parameters' gradient norm, step, zero the gradients; returns the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(trainable(model).values(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def encode_pairs(tok, prompts, completions, system=None, device=None):
    """Chat-templated prompts (left-padded) and completions + EOS (right-padded), as id tensors with masks, on
    `device` (the model's: models.device_of) when given."""
    texts = models.chat_prompts(tok, prompts, system)
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    comp = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    T = max(map(len, comp))
    ids = torch.full((len(comp), T), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(comp), T), dtype=torch.long)
    for i, c in enumerate(comp):
        ids[i, :len(c)], mask[i, :len(c)] = torch.tensor(c), 1
    return tuple(x.to(device) if device is not None else x for x in (enc["input_ids"], enc["attention_mask"], ids, mask))


class SamplingCopy:
    """A plain (adapter-free) copy of a LoRA policy in a lower precision, for the rollout only.

    `sync()` writes base + the active adapter's delta, computed in fp32, into the copy (a few tenths of a second
    for the 135M model); sampling then runs without LoRA wrappers, in bf16 matmuls (measured 1.5x faster on a CPU
    with AVX-512 BF16). The update and the reference pass stay in fp32: only which replies are drawn changes, as
    with a bf16 inference engine beside an fp32 trainer."""

    def __init__(self, model, dtype=torch.bfloat16):
        import copy

        from peft.tuners.lora import LoraLayer

        self.model, self.dtype = model, dtype
        self.copy = copy.deepcopy(model).merge_and_unload().to(dtype).eval()
        for p in self.copy.parameters():
            p.requires_grad_(False)
        own = dict(self.copy.named_modules())
        prefix = "base_model.model."
        self.pairs = [(layer, own[name[len(prefix):]]) for name, layer in model.named_modules()
                      if isinstance(layer, LoraLayer) and name.startswith(prefix)]

    @torch.no_grad()
    def sync(self):
        """Copy the policy as it is now: W + scale * B @ A of the active adapter, rounded to the copy's dtype."""
        models.check_weights(self.model)
        adapter = self.model.active_adapter
        for layer, target in self.pairs:
            w = layer.base_layer.weight
            if adapter in layer.lora_A and not layer.disable_adapters:
                w = w + layer.get_delta_weight(adapter)
            target.weight.copy_(w.to(self.dtype))
        return self.copy


FP32_SDPA = "sdpa_fp32_attention"   # transformers attention implementation registered by LowPrecisionBase


def _register_fp32_sdpa() -> str:
    """Register (once) an attention implementation that runs transformers' SDPA in fp32 on bf16 q, k, v and
    returns bf16: on this CPU the bf16 flash-attention backward is the slower one (measured 1.6x to 3x)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if FP32_SDPA not in AttentionInterface._global_mapping:
        def fp32_sdpa(module, query, key, value, attention_mask, **kwargs):
            dtype = query.dtype
            if attention_mask is not None and attention_mask.is_floating_point():
                attention_mask = attention_mask.float()
            out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                                  attention_mask, **kwargs)
            return out.to(dtype), weights

        AttentionInterface.register(FP32_SDPA, fp32_sdpa)
        AttentionMaskInterface.register(FP32_SDPA, sdpa_mask)
    return FP32_SDPA


class LowPrecisionBase:
    """The frozen base weights of a LoRA policy in bf16, swapped in for the update and the scoring passes.

    `with low:` points every frozen floating-point parameter of the model (base Linear weights, norms, the
    embedding and the tied lm_head) at a bf16 copy made once (`param.data` swapped; the fp32 tensors are put back
    on exit, also on an error), so the frozen path runs in bf16 matmuls. What stays fp32: the LoRA A / B
    parameters (trainable, so their gradients and the AdamW state too; peft casts each LoRA layer's input up to
    fp32 and the sum back to bf16), RMSNorm statistics (the model takes them in fp32 itself), attention (q, k, v
    upcast through a registered fp32 SDPA: the bf16 SDPA backward is the slower one on this CPU), and the
    log-softmax (token_logps upcasts the bf16 logits a few rows at a time). `fp32_head=True` keeps the output
    projection in fp32 as well (fp32 logits; about 7% slower update on the 135M model, a quarter less log-prob
    error). The backward pass must run inside the same `with` block as its forward (autograd reads the weights
    it saved).

    Outside the block the model is the fp32 model, untouched: evaluation, merging, saving (LoRA weights in
    fp32), SamplingCopy. The bf16 copies cost half the frozen weights' fp32 size in memory; a copy is remade when
    its parameter was replaced or changed in place (storage or version counter), though not after edits through
    `param.data`, which autograd does not count: call `refresh()` then."""

    def __init__(self, model, dtype=torch.bfloat16, fp32_head: bool = False):
        self.model, self.dtype, self.fp32_head = model, dtype, fp32_head
        self.copies = {}            # id(param) -> ((storage, version, dtype, shape) it was made from, copy)
        self.saved, self.hooks = None, []

    def frozen(self):
        """(the frozen floating-point parameters to run in low precision, the output projection kept in fp32 or
        None), found anew at each entry since adapters can be switched; a tied weight is listed once."""
        head = self.model.get_output_embeddings() if self.fp32_head else None
        if not (torch.is_tensor(getattr(head, "weight", None)) and head.weight.is_floating_point()):
            head = None
        skip = {id(head.weight)} if head is not None else set()
        params = {id(p): p for p in self.model.parameters() if not p.requires_grad and p.is_floating_point()}
        return [p for i, p in params.items() if i not in skip], head

    def refresh(self, params=None):
        """Make, or remake, the low-precision copies of the frozen parameters that changed since they were made."""
        params = self.frozen()[0] if params is None else params
        old, self.copies = self.copies, {}
        for p in params:
            key = (p.data_ptr(), p._version, p.dtype, p.shape)
            hit = old.get(id(p))
            self.copies[id(p)] = hit if hit is not None and hit[0] == key else (key, p.detach().to(self.dtype))

    def __enter__(self):
        if self.saved is not None:
            raise RuntimeError("LowPrecisionBase is already active; its `with` blocks cannot be nested")
        params, head = self.frozen()
        self.refresh(params)
        self.saved = [(p, p.data) for p in params]
        config = self.model.config
        self.attn = config._attn_implementation
        try:
            for p in params:
                p.data = self.copies[id(p)][1]
            if self.attn == "sdpa":
                config._attn_implementation = _register_fp32_sdpa()
            embed = self.model.get_input_embeddings()
            if head is not None:  # fp32_head
                if embed is not None and embed.weight is head.weight:  # tied to the fp32 head: rows cast to bf16
                    self.hooks.append(embed.register_forward_hook(lambda m, a, out: out.to(self.dtype)))
                self.hooks.append(head.register_forward_pre_hook(lambda m, a: (a[0].float(), *a[1:])))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for p, d in self.saved:
            p.data = d
        for h in self.hooks:
            h.remove()
        self.model.config._attn_implementation = self.attn
        self.saved, self.hooks = None, []
        return False


class Timer:
    """Accumulates wall time by phase (generation, reward, scoring, backward), each also counted in the notebook's
    phase profile (core.phases: generation for training, reward scoring, update)."""

    PROFILE = {"generation": "generation for training", "reward": "reward scoring", "scoring": "update",
               "backward": "update"}

    def __init__(self):
        self.seconds = {}

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        with phases.phase(self.PROFILE.get(phase, "update")):
            yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


# ---- probabilities of chosen completion tokens (RLPR's reward, the debate likelihood judge) ---------------------

def reference_mask(offsets, start: int, end: int) -> list:
    """Which tokens (character offsets (s, e)) overlap the reference's characters [start, end)."""
    return [s < end and e > start and e > s for s, e in offsets]


def token_probs(model, tok, prompts, completions, spans, temperature: float = 1.0, batch_size: int = 16, system=None):
    """Probabilities of the tokens overlapping each span, under the model (logits / temperature); None where span
    is None. Rows are batched by prompt (a user message or chat turns): the rows of one prompt (a rollout's group
    and its no-reasoning row) share a batch, up to batch_size rows, so that each prompt is encoded once."""
    out = [None] * len(prompts)
    texts = models.chat_prompts(tok, prompts, system)
    groups = {}
    for i, s in enumerate(spans):
        if s is not None:
            groups.setdefault(texts[i], []).append(i)
    chunks, chunk = [], []
    for rows in groups.values():
        for k in range(0, len(rows), batch_size):
            part = rows[k:k + batch_size]
            if chunk and len(chunk) + len(part) > batch_size:
                chunks.append(chunk)
                chunk = []
            chunk = chunk + part
    chunks += [chunk] if chunk else []
    model.eval()
    for chunk in chunks:
        unique = list(dict.fromkeys(texts[i] for i in chunk))
        enc = tok(unique, return_tensors="pt", padding=True, add_special_tokens=False)
        which = torch.tensor([unique.index(texts[i]) for i in chunk])
        comp = [tok(completions[i], add_special_tokens=False, return_offsets_mapping=True) for i in chunk]
        T = max(len(c["input_ids"]) for c in comp)
        ids = torch.full((len(chunk), T), tok.pad_token_id, dtype=torch.long)
        mask, ref = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
        for j, (i, c) in enumerate(zip(chunk, comp)):
            n = len(c["input_ids"])
            ids[j, :n], mask[j, :n] = torch.tensor(c["input_ids"]), 1
            ref[j, :n] = torch.tensor(reference_mask(c["offset_mapping"], *spans[i]))
        dev = models.device_of(model)  # the inputs go where the weights are (a GPU at scale)
        with torch.no_grad():
            logps = shared_prompt_logps(model, enc["input_ids"].to(dev), enc["attention_mask"].to(dev),
                                                 which.to(dev), ids.to(dev), mask.to(dev), temperature).cpu()
        for j, i in enumerate(chunk):
            out[i] = logps[j][ref[j]].exp().tolist()
    return out
