"""Independent runs side by side (replication.lm.parallel): the same results as one after another at one thread,
in job order, with a failing job named."""
import time

import pytest
import torch

from replication.core import phases
from replication.lm import grpo, models, parallel

LETTERS = set("abcdefghijklmnopqrstuvwxyz")


def letter_reward(prompts, completions, metadata, **log):
    return [sum(ch in LETTERS for ch in c) / max(len(c), 1) for c in completions]


def tiny_run(seed: int, steps: int = 3) -> dict:
    """A seeded GRPO run on a tiny model (its LoRA init, sampling and updates all from `seed`)."""
    torch.manual_seed(seed)
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=8, alpha=16)
    cfg = grpo.GRPOConfig(seed=seed, num_generations=4, max_new_tokens=6, lr=2e-2, kl_beta=0.0)
    trainer = grpo.GRPOTrainer(model, tok, letter_reward, cfg)
    rows = trainer.train(lambda step: (["write", "go"], [{}] * 2), steps, progress=False)
    lora = {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}
    return {"rewards": [r["reward_mean"] for r in rows], "threads": torch.get_num_threads(), "lora": lora}


def failing(seed: int):
    if seed == 1:
        raise ValueError(f"seed={seed} is not allowed")
    return seed


def test_parallel_runs_equal_sequential_ones_at_one_thread():
    jobs = [{"seed": s} for s in (0, 1, 2)]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sequential = parallel.run_jobs(tiny_run, jobs, workers=1)
    finally:
        torch.set_num_threads(before)
    side_by_side = parallel.run_jobs(tiny_run, jobs, workers=2)
    assert [r["threads"] for r in side_by_side] == [1, 1, 1]          # each worker keeps to one thread
    for a, b in zip(sequential, side_by_side):                        # the same runs, in job order
        assert a["rewards"] == b["rewards"]
        assert all(torch.equal(a["lora"][k], b["lora"][k]) for k in a["lora"])
    assert sequential[0]["rewards"] != sequential[1]["rewards"]       # the seeds differ: the check can fail


def tensor_sums(weights: dict) -> dict:
    """A job that carries many tensors (as MALT's stages carry adapter weights) and returns as many."""
    return {k: v * 2 for k, v in weights.items()}


def test_jobs_and_results_with_many_tensors_travel_by_value_not_as_file_descriptors():
    """Each tensor of a job pickled by torch's reductions would hold a file descriptor of shared memory until the
    worker takes it; 6 jobs x 400 tensors under a limit of 512 open files ran out of them before."""
    resource = pytest.importorskip("resource")
    jobs = [{"weights": {f"w{i}": torch.full((3,), float(j * 1000 + i)) for i in range(400)}} for j in range(6)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(512, hard), hard))
    try:
        out = parallel.run_jobs(tensor_sums, jobs, workers=2)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [len(o) for o in out] == [400] * 6
    assert all(torch.equal(out[j][f"w{i}"], torch.full((3,), 2.0 * (j * 1000 + i))) for j in range(6) for i in (0, 399))


def test_a_failing_job_is_named_and_bad_workers_refused():
    with pytest.raises(RuntimeError, match=r"parallel job 1 of 2 \(failing\) failed: ValueError: seed=1"):
        parallel.run_jobs(failing, [{"seed": 0}, {"seed": 1}], workers=2)
    assert parallel.run_jobs(failing, [{"seed": 0}, {"seed": 2}], workers=2) == [0, 2]
    with pytest.raises(ValueError, match="workers=0"):
        parallel.run_jobs(failing, [], workers=0)


def busy(seconds: float, name: str = "update") -> str:
    """Spend `seconds` in phase `name`, then as much again in no phase."""
    with phases.phase(name):
        time.sleep(seconds)
    time.sleep(seconds)
    return name


def test_the_workers_phase_profiles_count_in_the_parent():
    phases.reset()
    t0 = time.perf_counter()
    with phases.phase("statistics and plotting"):   # an enclosing phase gives up what the workers counted
        out = parallel.run_jobs(busy, [{"seconds": 0.6}, {"seconds": 0.6, "name": "generation for training"}], workers=2)
    wall = time.perf_counter() - t0
    assert out == ["update", "generation for training"]
    prof = phases.profile(wall)
    # each worker spent half its time in its phase; side by side they share the block's wall
    assert prof["update"] == pytest.approx(prof["generation for training"], rel=0.35)
    assert 0.1 < prof["update"] < 0.5 * wall
    assert prof["update"] + prof["generation for training"] + prof["statistics and plotting"] == pytest.approx(wall, rel=0.05)


def test_absorb_scales_the_workers_seconds_to_the_wall():
    phases.reset()
    phases.absorb([{"totals": {"update": 6.0}, "reused": {"entries": 1, "seconds": 5.0, "untimed": 0}, "wall": 8.0},
                   {"totals": {"update": 2.0, "judging": 2.0}, "reused": {"entries": 2, "seconds": 1.0, "untimed": 1},
                    "wall": 8.0}], wall=8.0)
    prof = phases.profile(8.0)
    assert prof["update"] == pytest.approx(4.0) and prof["judging"] == pytest.approx(1.0) and prof["other"] == pytest.approx(3.0)
    assert phases.reused_profile() == {"entries": 3, "seconds": 6.0, "untimed": 1}
    phases.reset()


def where() -> str:
    from replication.lm import models

    return str(models.current_device())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_workers_put_models_on_the_device_this_process_uses():
    models.use_device("cuda")
    try:
        assert parallel.run_jobs(where, [{}, {}], workers=2) == ["cuda", "cuda"]
    finally:
        models.use_device("cpu")


def square_into(folder: str, i: int) -> int:
    """i * i into the cache `folder` (a worker of made_then_read's test)."""
    from replication.core import cache

    return cache.cached(folder, "square", {"i": i}, lambda: i * i)


def test_made_then_read_makes_the_missing_pieces_in_workers_and_reads_every_piece_in_order(tmp_path):
    from replication.core import cache

    folder = str(tmp_path)
    cache.cached(folder, "square", {"i": 2}, lambda: 4)              # made before: read, not made again
    read_made = []

    def pending(i):
        return None if cache.intact(folder, "square", {"i": i}) else {"folder": folder, "i": i}

    def read(i):
        read_made.append(phases._made_here[0] > 0)
        return cache.cached(folder, "square", {"i": i}, lambda: -1)  # -1: made here, which a worker should have done

    phases.reset()
    values, made = parallel.made_then_read([3, 2, 5], pending, square_into, read, workers=2, what="squares")
    assert values == [9, 4, 25] and made == {3: 9, 5: 25}
    assert read_made == [True, False, True]                          # only what a worker made is not counted as reuse
    assert phases.reused_profile()["entries"] == 1
    read_made.clear()
    again, made = parallel.made_then_read([3, 2, 7], pending, square_into, read, workers=1)
    assert again == [9, 4, -1] and made == {} and read_made == [False] * 3   # workers=1: read makes it here
    with pytest.raises(ValueError, match="workers=0"):
        parallel.made_then_read([], pending, square_into, read, workers=0)
    assert not cache.intact(folder, "square", {"i": 8}) and cache.intact(folder, "square", {"i": 7})
    (cache.path_for(folder, "square", {"i": 7}) / "value.json").write_text("0")
    assert not cache.intact(folder, "square", {"i": 7})             # a changed value no longer matches its checksum


def linger(folder: str, i: int) -> int:
    """Writes this worker's pid into `folder`, then sleeps far longer than the test waits (a job still running when
    its parent dies)."""
    import os
    from pathlib import Path

    (Path(folder) / f"worker-{i}.pid").write_text(str(os.getpid()))
    time.sleep(600)
    return i


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie waits for its reaper only
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_workers_end_when_their_parent_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    here = str(Path(__file__).parent)
    parent = subprocess.Popen([sys.executable, "-c", (
        f"import sys; sys.path.insert(0, {here!r})\n"
        "from test_parallel import linger\n"
        "from replication.lm import parallel\n"
        f"parallel.run_jobs(linger, [{{'folder': {str(tmp_path)!r}, 'i': 0}}, {{'folder': {str(tmp_path)!r}, 'i': 1}}], workers=2)\n")])
    try:
        deadline = time.time() + 120
        while len(list(tmp_path.glob("worker-*.pid"))) < 2:
            assert parent.poll() is None, "the parent ended before its workers started"
            assert time.time() < deadline, "the workers did not start within 120 s"
            time.sleep(0.2)
        workers = [int(p.read_text()) for p in tmp_path.glob("worker-*.pid")]
        assert all(_alive(w) for w in workers)                        # busy in their jobs
    finally:
        parent.send_signal(signal.SIGKILL)                            # the kernel killed, as by a timeout
        parent.wait()
    deadline = time.time() + 15
    while any(_alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.2)
    left = [w for w in workers if _alive(w)]
    for w in left:                                                    # leave no orphan even when the check fails
        os.kill(w, signal.SIGKILL)
    assert not left, f"workers {left} outlived their killed parent"
