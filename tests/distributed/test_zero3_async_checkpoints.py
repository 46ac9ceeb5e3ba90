"""ZeRO-3 (Megatron-FSDP) checkpoints and asynchronous saves, DP=2 with real processes.

One uninterrupted ZeRO-3 run of 20 steps with synchronous saves every 5 is the reference of
every check: the SIGKILLed-and-resumed run, the reshard to ZeRO-1 and back, and the runs with
--async-save (same losses, same checkpoint bytes, a kill while a save is in flight).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from megatron_lgs.checkpointing import FAULT_ENV, TRACKER_FILE, latest_iteration
from tests.conftest import TINY_GPT, report, run_pretrain

pytestmark = pytest.mark.slow

ZERO3 = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
ZERO1 = ["--use-distributed-optimizer"]
# Dropout on, so every rank's RNG streams must come back too.
RUN = ["--train-iters", "20", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
       "--save-interval", "5"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_cache):
    run = run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *RUN, *ZERO3], nproc=2,
                       save_dir=tmp_path_factory.mktemp("zero3-straight"))
    assert len(run.losses()) == 20
    return run


@pytest.fixture(scope="module")
def killed(tmp_path_factory, data_cache):
    """ZeRO-3, SIGKILLed right after its iteration-10 checkpoint was committed."""
    save = tmp_path_factory.mktemp("zero3-killed")
    run = run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *RUN, *ZERO3], nproc=2,
                       save_dir=save, expect_success=False,
                       env={FAULT_ENV: "save:after_commit@10"})
    assert run.returncode != 0 and latest_iteration(str(save)) == 10
    return run


def _tensors(checkpoint: Path, tmp: Path) -> dict[str, torch.Tensor]:
    out = tmp / f"{checkpoint.parent.name}-{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, out)
    return {k: v for k, v in torch.load(out, weights_only=True).items()
            if isinstance(v, torch.Tensor)}


def _load_dir(save: Path, iteration: int, dest: Path) -> Path:
    """A --load directory whose latest checkpoint is `iteration` of `save`."""
    name = f"iter_{iteration:07d}"
    shutil.copytree(save / name, dest / name)
    (dest / TRACKER_FILE).write_text(str(iteration))
    return dest


def test_zero3_killed_after_save_then_resumed_is_bitwise_identical(straight, killed, tiny,
                                                                   tmp_path):
    resumed = run_pretrain([*tiny, *RUN, *ZERO3, "--load", str(killed.save_dir)], nproc=2,
                           save_dir=killed.save_dir)
    assert "loaded checkpoint" in resumed.stdout and "at iteration 10" in resumed.stdout
    assert resumed.losses() == straight.losses()  # bitwise: floats compared with ==
    # ... and so is everything it saved at the end: weights, fp32 main weights, Adam moments.
    ours = _tensors(killed.save_dir / "iter_0000020", tmp_path)
    theirs = _tensors(straight.save_dir / "iter_0000020", tmp_path)
    assert set(ours) == set(theirs) and any(k.startswith("optimizer.state.exp_avg.") for k in ours)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_zero3_reshards_to_zero1_and_back_with_the_uninterrupted_losses(straight, killed, tiny,
                                                                         tmp_path):
    reference = straight.losses()
    # ZeRO-3 (iteration 10) -> ZeRO-1: trains 11..15, saves 15 in the distributed-optimizer layout.
    zero1 = run_pretrain([*tiny, *RUN, *ZERO1, "--exit-interval", "15", "--load",
                          str(_load_dir(killed.save_dir, 10, tmp_path / "load1"))], nproc=2,
                         save_dir=tmp_path / "zero1")
    saved = (tmp_path / "zero1" / "iter_0000015" / "layout.json").read_text()
    assert '"optimizer_sharding": "distributed_optimizer"' in saved
    # ZeRO-1 (iteration 15) -> ZeRO-3: trains 16..20.
    zero3 = run_pretrain([*tiny, *RUN, *ZERO3, "--load",
                          str(_load_dir(tmp_path / "zero1", 15, tmp_path / "load3"))], nproc=2,
                         save_dir=tmp_path / "zero3")
    losses = zero1.losses() + zero3.losses()
    assert [r["iteration"] for r in zero1.records("train") + zero3.records("train")] == \
        list(range(11, 21))
    gap = max(abs(a - b) for a, b in zip(losses, reference[10:], strict=True))
    assert gap <= 1e-6
    ours = _tensors(tmp_path / "zero1" / "iter_0000015", tmp_path)
    theirs = _tensors(straight.save_dir / "iter_0000015", tmp_path)
    assert set(ours) == set(theirs)
    worst = max((ours[k] - theirs[k]).abs().max().item() for k in ours)
    assert worst <= 1e-6
    report(f"ZeRO-3 -> ZeRO-1 -> ZeRO-3 (DP=2): largest loss gap to the uninterrupted run over "
           f"10 steps {gap:.1e}, largest tensor gap at iteration 15 {worst:.1e}")


@pytest.fixture(scope="module")
def async_run(straight, tmp_path_factory, data_cache):
    return run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *RUN, *ZERO3, "--async-save"],
                        nproc=2, save_dir=tmp_path_factory.mktemp("zero3-async"))


def test_async_saves_train_and_write_exactly_what_sync_saves_do(straight, async_run, tmp_path):
    assert async_run.losses() == straight.losses()  # bitwise
    saves = async_run.records("save")
    assert [s["iteration"] for s in saves] == [5, 10, 15, 20]
    assert all(s["asynchronous"] for s in saves)
    # The run exits only after its last save is committed: the tracker names iteration 20.
    assert latest_iteration(str(async_run.save_dir)) == 20
    assert not list(async_run.save_dir.glob("*.partial"))
    # Training went on while iteration 10 was written: the bytes are still iteration 10's.
    for iteration in (10, 20):
        name = f"iter_{iteration:07d}"
        ours = _tensors(async_run.save_dir / name, tmp_path)
        theirs = _tensors(straight.save_dir / name, tmp_path)
        assert set(ours) == set(theirs)
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), name
        assert (async_run.save_dir / name / "run_state.json").read_text() == \
            (straight.save_dir / name / "run_state.json").read_text()


def test_a_kill_while_an_async_save_is_in_flight_leaves_the_previous_checkpoint(straight, tiny,
                                                                               tmp_path):
    save = tmp_path / "ckpt"
    args = [*tiny, *RUN, *ZERO3, "--async-save"]
    killed = run_pretrain(args, nproc=2, save_dir=save, expect_success=False,
                          env={FAULT_ENV: "save:in_flight@15"})
    assert killed.returncode != 0
    previous = latest_iteration(str(save))
    assert previous in (5, 10)  # the last save committed before the kill
    assert not (save / "iter_0000015").exists()
    resumed = run_pretrain([*args, "--load", str(save)], nproc=2, save_dir=save)
    assert f"at iteration {previous}" in resumed.stdout
    assert resumed.losses()[-(20 - previous):] == straight.losses()[previous:]
    assert latest_iteration(str(save)) == 20
