"""`bench generate`'s two paths: the workbook's generation (shared prefill of a common leading run, per-prompt KV
copies for repeats) gives the plain transformers generate()'s greedy fp32 outputs, token for token."""
import pytest

from replication.lm import bench, models


def test_greedy_outputs_of_our_path_equal_plain_generate(tiny):
    model, tok = tiny
    shared = "a worked example that every prompt shares before its own question " * 3   # > MIN_SHARED tokens
    texts = models.chat_prompts(tok, [shared + q for q in ("one", "two plus two", "three", "what is five", "x")])
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    assert min(map(len, ids)) > models.MIN_SHARED                   # the shared-prefill path is the one taken
    ours = models.generate(model, tok, texts, max_new_tokens=8, batch_size=4, chat=False)
    plain = bench.plain_generate(model, tok, texts, max_new_tokens=8, batch_size=4)
    assert ours.completion_ids == plain and sum(map(len, plain)) > 0
    # repeats share one prefill per prompt: greedy repeats equal the plain path's repeated rows
    again = models.generate(model, tok, texts[:2], max_new_tokens=6, batch_size=4, chat=False, repeats=2)
    assert again.completion_ids == bench.plain_generate(model, tok, texts[:2], max_new_tokens=6, batch_size=4, repeats=2)



def _rows_ending_at_different_steps(tiny):
    """Templated prompts, their ids and mask, and an end token the tiny model emits at different steps per row."""
    import torch
    from transformers import GenerationConfig

    model, tok = tiny
    texts = models.chat_prompts(tok, ["one", "two plus two", "three", "what is five", "x", "a longer question here"])
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    with torch.no_grad():
        free = model.generate(input_ids=ids, attention_mask=mask, generation_config=GenerationConfig(
            max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None))[:, ids.shape[1]:]
    return ids, mask, int(torch.mode(free[:, 1:].flatten()).values)   # the commonest later token


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_decode_drops_finished_rows_and_gives_generates_tokens(tiny, temperature):
    """Rows that finish early leave the batch: the completions equal transformers' generate() token for token (pad
    after the end), greedy and sampled (same seed, same draws), with and without a shared prefill cache."""
    import torch
    from transformers import GenerationConfig

    from replication.lm import generation

    model, tok = tiny
    ids, mask, end = _rows_ending_at_different_steps(tiny)
    sampled = temperature > 0
    cfg = GenerationConfig(max_new_tokens=12, do_sample=sampled, temperature=temperature if sampled else None,
                           pad_token_id=tok.pad_token_id, eos_token_id=end)
    warp = generation.warpers(model, cfg) if sampled else None
    assert not sampled or [type(p).__name__ for p in warp] == ["TemperatureLogitsWarper", "TopKLogitsWarper"]
    results = []
    with torch.no_grad():
        for prefill in (False, True):
            torch.manual_seed(3)
            cache, head, head_mask = None, ids, mask
            if prefill:
                _, cache, head, head_mask, _ = generation.encode_prompts(model, ids[:, :-1], mask[:, :-1], min_prefix=1)
                head, head_mask = torch.cat([head, ids[:, -1:]], 1), torch.cat([head_mask, mask[:, -1:]], 1)
            ours = generation.decode(model, head, head_mask, 12, end, tok.pad_token_id, cache, warp)
            torch.manual_seed(3)
            extra = {"past_key_values": generation.encode_prompts(model, ids[:, :-1], mask[:, :-1], min_prefix=1)[1]} \
                if prefill else {}
            plain = model.generate(input_ids=head, attention_mask=head_mask, generation_config=cfg, **extra)[:, head.shape[1]:]
            results.append((ours, plain))
    for ours, plain in results:
        lengths = generation.completion_mask(plain, end).sum(1)
        assert lengths.min() < lengths.max()                   # rows leave the batch at different steps
        assert torch.equal(ours, plain)


@pytest.mark.parametrize("argv, says", [(["grpo", "--device", "cuda"], "allowed only with generate and update"),
                                        (["generate", "--device", "tpu"], "device='tpu' is not allowed"),
                                        (["generate", "--device", "cuda:99"], "is not allowed here")])
def test_bench_device_option_refuses_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err and "device" in err


def test_matmul_peak_on_the_cpu_device():
    assert bench.matmul_peak(n=64, reps=2, device="cpu") > 0
