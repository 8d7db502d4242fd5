"""`bench generate`'s two paths: the workbook's generation (shared prefill of a common leading run, per-prompt KV
copies for repeats) gives the plain transformers generate()'s greedy fp32 outputs, token for token."""
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
