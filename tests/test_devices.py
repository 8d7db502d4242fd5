"""The model-based rewards and judges put the inputs they build on the model's device (a GPU at scale).

There is no second device here, so the tiny model is moved to PyTorch's `meta` device (shapes only): every tensor
that reaches its forward is recorded, and must be on `meta`, as it would have to be on the GPU. A tensor built on
the CPU and not moved shows up as "cpu". The paths stop at the first step that reads values (meta tensors hold
none; the shared-prompt check is skipped on meta); the inputs of the forwards before it are checked."""
import pytest
import torch

from replication.lm import dpo, generation, judges, models, tasks
from replication.papers.elo_evolve import judging
from replication.papers.rlpr import rlpr


def meta_model():
    model, tok = models.tiny_model(seed=0)
    model.to("meta")
    seen = []

    def hook(module, args, kwargs):
        seen.extend(t.device.type for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return model, tok, seen


PROBLEMS = tasks.make_level("1d-1step-add", 2, seed=0)
PATHS = {
    "rlpr scoring": lambda m, t: rlpr.baseline_probs(m, t, [p.prompt() for p in PROBLEMS], [str(p.answer) for p in PROBLEMS]),
    "likelihood judge": lambda m, t: judging.LikelihoodJudge(m, t).p_win(
        [p.question for p in PROBLEMS], [p.answer for p in PROBLEMS], ["The answer is 3.", "4"], ["5", "The answer is 6."]),
    "likelihood judge, worked examples": lambda m, t: judging.LikelihoodJudge(m, t, PROBLEMS[:1]).p_win(
        [PROBLEMS[1].question], [PROBLEMS[1].answer], ["The answer is 3."], ["5"]),
    "llm judge": lambda m, t: judging.LLMJudge(m, t).p_win(
        [p.question for p in PROBLEMS], [p.answer for p in PROBLEMS], ["The answer is 3.", "4"], ["5", "6"]),
    "response log-probs": lambda m, t: judges.response_logps(m, t, [p.question for p in PROBLEMS], ["3", "4"]),
    "sampling (opponent pool, MAE, MALT trees)": lambda m, t: models.sample(m, t, models.chat_prompts(
        t, [p.prompt() for p in PROBLEMS]), 4, 1.0, repeats=2),
    "sft / dpo log-probs": lambda m, t: dpo._seq_sums(m, t, [p.prompt() for p in PROBLEMS], ["3", "4"], None),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_inputs_are_built_on_the_models_device(path, monkeypatch):
    model, tok, seen = meta_model()
    real = models.common_prefix  # reads token values: on meta tensors, no shared run (encode prompts as given)
    monkeypatch.setattr(generation, "common_prefix", lambda ids, mask: real(ids, mask) if ids.device.type != "meta" else 0)
    try:
        PATHS[path](model, tok)
    except (NotImplementedError, RuntimeError, ValueError) as e:  # a step that reads values of meta tensors
        assert "device" not in str(e) or "meta" in str(e).split("device")[0], e
    assert seen, "the path must reach the model"
    assert set(seen) == {"meta"}, f"{path}: inputs on {sorted(set(seen) - {'meta'})}, the model on meta"


# ---- the notebooks' `device` parameter -------------------------------------------------------------------

def test_use_device_resolves_and_names_a_device_it_cannot_use(monkeypatch):
    monkeypatch.setattr(models, "_device", models._device)          # restored after the test
    assert models.use_device("cpu") == torch.device("cpu")
    assert models.use_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device='gpu' is not allowed; use auto, cpu, cuda or cuda:N"):
        models.use_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device='cuda:1' is not allowed here: torch sees 0 CUDA device"):
            models.use_device("cuda:1")


@pytest.mark.parametrize("gpus", [0, 1])
def test_the_device_is_described_as_it_resolves_with_the_gpus_name(gpus, monkeypatch):
    """What the metrics' `device` and the figure digests' `accelerator` part record (no GPU here: torch's answers
    are patched): the CPU, or the GPU by name, also where the CPU beside it has bf16 kernels of its own."""
    from replication.run import runner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(models, "_device", torch.device("cpu"))
    gpu = "cuda: NVIDIA H200 (CUDA 13.0)"
    assert models.describe_device("cpu") == models.describe_device() == runner.accelerator("cpu") == "cpu"
    assert models.describe_device("auto") == runner.accelerator() == (gpu if gpus else "cpu")
    assert models.describe_device("cuda") == (gpu if gpus else "cuda (not seen)")
    assert models.describe_device("cuda:1") == "cuda:1 (not seen)"
    monkeypatch.setattr(models, "_device", torch.device("cuda"))   # as use_device("auto") would set it with a GPU
    assert models.describe_device() == (gpu if gpus else "cuda (not seen)")


def test_load_model_puts_the_model_on_the_device_set(monkeypatch):
    """No second device here: the device is set to `meta` directly, as use_device would set cuda."""
    monkeypatch.setattr(models, "_device", torch.device("meta"))
    model, _ = models.load_model("smollm2-135m-instruct")
    assert {p.device.type for p in model.parameters()} == {"meta"} and models.device_of(model).type == "meta"


def test_advantages_follow_the_rollouts_device():
    """GRPO's and MAE's advantages are built where the rollout's tensors are (rewards come from Python lists)."""
    from replication.lm import grpo
    from replication.papers.mae import mae

    mask = torch.ones(4, 3, device="meta")
    assert grpo.reinforce_pp_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), mask, ["a", "a", "b", "b"]).device.type == "meta"
    with pytest.raises(RuntimeError, match="item"):   # reached the check that reads values: no device mismatch before it
        mae.role_advantages([[1.0, 0.0], [0.5, 0.5]], [torch.ones(2, 3, device="meta"), torch.ones(2, 2, device="meta")],
                            ["solver", "judge"])


def test_every_notebook_takes_a_device_and_checks_it():
    from replication.run import settings  # noqa: F401  (registers the classes)
    from replication.core import config, params

    for stem in config.list_notebooks():
        cell = params.cell_values(config.NOTEBOOKS / f"{stem}.ipynb")
        assert cell["device"] == "auto", stem
        assert params.build(stem, {**cell, "device": "cuda:1"}).device == "cuda:1"
        with pytest.raises(ValueError, match="device='gpu' is not allowed; use auto, cpu, cuda or cuda:N"):
            params.build(stem, {**cell, "device": "gpu"})


def test_the_gpu_profile_refuses_on_a_cpu_unless_asked_for_cpu_speed(monkeypatch, tmp_path):
    from replication.run import runner

    monkeypatch.setenv("REPLICATION_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(runner, "gpu_available", lambda: False)
    with pytest.raises(runner.RunError, match=r"--profile gpu needs a GPU .* add --set device=cpu"):
        runner.run("gpu", only="01", log=lambda *_: None)
    ran = []
    monkeypatch.setattr(runner, "execute", lambda stem, *a, **k: ran.append((stem, a[0])) or "executed")
    runner.run("gpu", only="01", overrides={"device": "cpu"}, report=False, log=lambda *_: None)
    assert ran == [("01_noise_analysis", "gpu")]
    assert runner.parameters("01_noise_analysis", "gpu", overrides={"device": "cpu"})["judge_questions"] == 200


# ---- the notebooks' `rollout_dtype = "auto"`: bf16 where the device has bf16 kernels ----------------------

@pytest.mark.parametrize("kernels, want", [(True, "bfloat16"), (False, "float32")])
def test_auto_precision_is_bf16_only_where_the_device_has_bf16_kernels(kernels, want, monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: kernels)
    monkeypatch.setattr(models, "_device", torch.device("cpu"))
    assert models.bf16_kernels() is kernels
    assert models.resolve_dtype("rollout_dtype", "auto") == want
    assert [models.resolve_dtype("rollout_dtype", d) for d in ("float32", "bfloat16")] == ["float32", "bfloat16"]
    assert models.resolve_dtype("step_update_dtypes", ["float32", "auto", "bfloat16"]) == list(dict.fromkeys(
        ["float32", want, "bfloat16"]))
    with pytest.raises(ValueError, match="rollout_dtype='fp16' is not allowed; choose one of 'auto', 'float32', 'bfloat16'"):
        models.resolve_dtype("rollout_dtype", "fp16")


@pytest.mark.parametrize("supported", [True, False])
def test_auto_precision_on_a_gpu_asks_the_gpu(supported, monkeypatch):
    """On a CUDA device the answer is the GPU's bf16 support, whatever the CPU has (no GPU here: the device is set
    as use_device would set it, and torch's answer is patched)."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: not supported)
    monkeypatch.setattr(models, "_device", torch.device("cuda"))
    assert models.bf16_kernels() is supported
    assert models.resolve_dtype("rollout_dtype", "auto") == ("bfloat16" if supported else "float32")


@pytest.mark.parametrize("kernels, want", [(True, "bfloat16"), (False, "float32")])
def test_start_resolves_auto_precision_in_the_params_and_the_notebook(kernels, want, monkeypatch, runs, capsys):
    """What a notebook sees after `run = workbook.start(stem, globals())`: the resolved precision, in run.params
    (so in the metrics record and every cache key built from it) and in its own `rollout_dtype`; a precision
    named in the cell is kept as it is."""
    from replication.run import settings, workbook  # noqa: F401  (registers the classes)
    from replication.core import config, params

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: kernels)
    monkeypatch.setattr(models, "_device", models._device)          # restored after the test
    monkeypatch.setenv(config.RUNNER_ENV, "smoke")                   # the values as given (no profile applied)
    stems = [s for s in config.list_notebooks()
             if "rollout_dtype" in params.cell_values(config.NOTEBOOKS / f"{s}.ipynb")]
    assert stems == ["00_setup_and_baselines", "02_elo_dynamics", "03_rlpr_debiasing", "05_malt_trajectory_trees"]
    for stem in stems:
        namespace = {**params.cell_values(config.NOTEBOOKS / f"{stem}.ipynb"), "device": "cpu"}
        assert namespace["rollout_dtype"] == "auto", stem
        run = workbook.start(stem, namespace)
        assert run.params.rollout_dtype == namespace["rollout_dtype"] == want, stem
        assert f"rollout_dtype = 'auto' -> {want!r} on cpu" in capsys.readouterr().out
        if stem == "00_setup_and_baselines":   # the step probe: fp32, then bf16 only where it has kernels
            assert run.params.step_update_dtypes == namespace["step_update_dtypes"] == list(dict.fromkeys(["float32", want]))
        assert workbook.start(stem, {**namespace, "rollout_dtype": "bfloat16"}).params.rollout_dtype == "bfloat16"


@pytest.mark.parametrize("stored_kernels", [True, False])
def test_auto_precision_follows_the_results_store_on_a_cpu_of_another_kind(stored_kernels, monkeypatch, runs, tmp_path,
                                                                           capsys):
    """A default run on a CPU without bf16 kernels reads "auto" as the store's entries were made (bfloat16 where they
    were made with bf16 kernels), so it finds them; with the store off (--retrain) "auto" is this machine's choice."""
    from replication.run import settings, workbook  # noqa: F401  (registers the classes)
    from replication.core import config, files, params, store

    stem = "02_elo_dynamics"
    root = tmp_path / "store"
    made = {"cpu": "avx2", "bf16_kernels": stored_kernels}
    files.write_json(root / f"{stem}.json", {"notebook": stem, "entries": {"a": {"kind": "value", "made": made}}})
    files.write_json(root / "00_setup_and_baselines.json",   # an older record: the CPU's flags only
                     {"notebook": "00_setup_and_baselines", "entries": {"a": {"made": {"cpu": "avx512f avx512_bf16"}}}})
    assert store.auto_precision(root, stem) == ("bfloat16" if stored_kernels else "float32")
    assert store.auto_precision(root, "00_setup_and_baselines") == "bfloat16"
    assert store.auto_precision(root, "03_rlpr_debiasing") is None
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    monkeypatch.setattr(models, "_device", models._device)
    monkeypatch.setenv(config.RUNNER_ENV, "smoke")
    namespace = {**params.cell_values(config.NOTEBOOKS / f"{stem}.ipynb"), "device": "cpu"}
    monkeypatch.setenv("REPLICATION_STORE", str(root))
    want = "bfloat16" if stored_kernels else "float32"
    assert workbook.start(stem, dict(namespace)).params.rollout_dtype == want
    out = capsys.readouterr().out
    assert f"rollout_dtype = 'auto' -> {want!r} on cpu" in out
    assert ("as the results store's entries of this notebook were made" in out) is stored_kernels
    monkeypatch.setenv("REPLICATION_STORE", "off")
    assert workbook.start(stem, dict(namespace)).params.rollout_dtype == "float32"
