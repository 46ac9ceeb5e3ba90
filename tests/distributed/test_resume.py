"""Resume is bit-exact, even when the process dies (SIGKILL) right after a save or in the
middle of one."""

from __future__ import annotations

import json

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.checkpointing import FAULT_ENV, RUN_STATE_FILE
from megatron_lgs.run_state import legacy_config_fingerprint
from tests.conftest import TINY_GPT, run_pretrain

pytestmark = pytest.mark.slow

# Dropout on, so the RNG state of every rank must come back too.
RUN = ["--train-iters", "20", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
LAYOUTS = {"dp1": (1, []), "dp2-zero1": (2, ["--use-distributed-optimizer"])}


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_cache) -> dict[str, list[float]]:
    losses = {}
    for name, (nproc, extra) in LAYOUTS.items():
        save = tmp_path_factory.mktemp(f"straight-{name}")
        losses[name] = run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *RUN, *extra],
                                    nproc=nproc, save_dir=save).losses()
        assert len(losses[name]) == 20
    return losses


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_killed_after_save_then_resumed_is_bitwise_identical(straight, tiny, tmp_path, layout):
    nproc, extra = LAYOUTS[layout]
    save = tmp_path / "ckpt"
    args = [*tiny, *RUN, *extra, "--save-interval", "10"]
    killed = run_pretrain(args, nproc=nproc, save_dir=save, expect_success=False,
                          env={FAULT_ENV: "save:after_commit@10"})
    assert killed.returncode != 0  # SIGKILLed after the iteration-10 save completed
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "10"
    resumed = run_pretrain([*args, "--load", str(save)], nproc=nproc, save_dir=save)
    assert "loaded checkpoint" in resumed.stdout and "at iteration 10" in resumed.stdout
    assert resumed.losses() == straight[layout]  # bitwise: floats compared with ==


def test_a_save_killed_mid_write_leaves_the_previous_checkpoint_loadable(straight, tiny,
                                                                         tmp_path):
    save = tmp_path / "ckpt"
    args = [*tiny, *RUN, "--save-interval", "5"]
    killed = run_pretrain(args, save_dir=save, expect_success=False,
                          env={FAULT_ENV: "save:after_shards@10"})
    assert killed.returncode != 0
    assert (save / "iter_0000010.partial").is_dir() and not (save / "iter_0000010").exists()
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "5"
    resumed = run_pretrain([*args, "--load", str(save)], save_dir=save)
    assert "at iteration 5" in resumed.stdout
    assert resumed.losses()[-15:] == straight["dp1"][-15:]
    assert (save / "iter_0000010").is_dir() and not (save / "iter_0000010.partial").exists()


def test_a_different_model_refuses_the_checkpoint_in_one_line(tiny, tmp_path):
    save = tmp_path / "ckpt"
    run_pretrain([*tiny, "--train-iters", "2"], save_dir=save)
    refused = run_pretrain([*tiny, "--train-iters", "4", "--num-layers", "3", "--load",
                            str(save)], save_dir=save, expect_success=False)
    assert refused.returncode == 2
    assert "it was saved with other settings: --num-layers 2 -> 3" in refused.stderr
    assert "--finetune" in refused.stderr


def test_finetune_from_a_folder_without_a_checkpoint_is_refused(tiny, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = run_pretrain([*tiny, "--train-iters", "2", "--finetune", "--load", str(empty)],
                           save_dir=tmp_path / "ckpt", expect_success=False)
    assert refused.returncode == 2
    assert f"--finetune: no checkpoint under --load {empty}" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_resume_may_turn_recompute_on(straight, tiny, tmp_path):
    """Recompute (and the MoE dispatcher, the EP overlap) schedule a step, they do not change
    what it computes: a run resumed with full recompute continues bit for bit (refused as
    another config until 2026-12-07). A checkpoint saved before then carries the fingerprint
    with the schedule hashed in, and still resumes in its own schedule."""
    save = tmp_path / "ckpt"
    args = [*tiny, *RUN]
    run_pretrain([*args, "--exit-interval", "10"], save_dir=save)
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "10"
    recompute = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"]
    state_file = save / "iter_0000010" / RUN_STATE_FILE
    saved_state = json.loads(state_file.read_text())
    resumed = run_pretrain([*args, *recompute, "--load", str(save)], save_dir=tmp_path / "on")
    assert [r["loss"] for r in resumed.records("train")] == straight["dp1"][10:]
    legacy = legacy_config_fingerprint(parse_args([*args, *recompute], world_size=1))
    assert legacy != saved_state["config_fingerprint"]
    for fingerprint, resumes in ((legacy, True), ("0" * 16, False)):
        state_file.write_text(json.dumps({**saved_state, "config_fingerprint": fingerprint}))
        run = run_pretrain([*args, *recompute, "--load", str(save)], expect_success=False,
                           save_dir=tmp_path / fingerprint)
        assert (run.returncode == 0) is resumes, run.stderr[-500:]


def test_a_resume_may_change_the_global_batch_size(tiny, tmp_path):
    """A run stopped at iteration 2 with batch 8 and resumed with batch 16 continues at sample 16
    with the bigger batch: the same steps, bit for bit, as one run whose batch ramps from 8 to 16
    at sample 16. Until 2026-12-07 such a resume was refused as another run; it still is from a
    checkpoint that does not record its batch size (saved before)."""
    args = [*tiny, "--train-iters", "4", "--log-interval", "1"]
    assert args[args.index("--global-batch-size") + 1] == "8"
    bigger = ["--global-batch-size", "16"]
    ramped = run_pretrain([*args, *bigger, "--rampup-batch-size", "8", "8", "16"],
                          save_dir=tmp_path / "ramped").losses()
    save = tmp_path / "ckpt"
    run_pretrain([*args, "--exit-interval", "2"], save_dir=save)
    resumed = run_pretrain([*args, *bigger, "--load", str(save)], save_dir=tmp_path / "resumed")
    assert "global batch size changed from 8 to 16: the run continues at sample 16" \
        in resumed.stdout
    steps = resumed.records("train")
    assert [r["iteration"] for r in steps] == [3, 4]
    assert [r["loss"] for r in steps] == ramped[2:]

    state_file = save / "iter_0000002" / RUN_STATE_FILE
    state = json.loads(state_file.read_text())
    for recorded_since_then in ("global_batch_size", "config"):
        state.pop(recorded_since_then)
    state_file.write_text(json.dumps(state))
    refused = run_pretrain([*args, *bigger, "--load", str(save)], expect_success=False,
                           save_dir=tmp_path / "legacy")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "its config fingerprint" in refused.stderr and "do not record" in refused.stderr


# One process, and megatron's chained optimizers (dense and expert parameters) under ZeRO-1.
SCHEDULE_LAYOUTS = {"one process": (1, []),
                    "MoE EP2 ZeRO-1": (2, ["--num-experts", "2", "--expert-model-parallel-size",
                                           "2", "--disable-bias-linear",
                                           "--use-distributed-optimizer"])}


@pytest.mark.parametrize("layout", sorted(SCHEDULE_LAYOUTS))
def test_a_resume_may_change_the_lr_schedule_with_megatrons_flag(tiny, tmp_path, layout):
    """Stopped at step 2 of 4 and resumed at half the learning rate: refused in one line naming
    the change and Megatron-LM's two flags; with --override-opt_param-scheduler (and other
    clipping) the third step's loss is the uninterrupted run's (the weights and moments of step
    2 came back) and steps 3 and 4 run at a fresh half-rate run's learning rates. Until
    2026-12-08 a changed rate or clipping was refused as another run, and a longer
    --train-iters kept the checkpoint's decay without a word."""
    nproc, extra = SCHEDULE_LAYOUTS[layout]
    args = [*tiny, *extra, "--train-iters", "4", "--log-interval", "1"]
    straight = run_pretrain(args, nproc=nproc, save_dir=tmp_path / "straight").records("train")
    save = tmp_path / "ckpt"
    run_pretrain([*args, "--exit-interval", "2"], nproc=nproc, save_dir=save)
    half = [*args, "--lr", "1e-3"]
    refused = run_pretrain([*half, "--load", str(save)], nproc=nproc, expect_success=False,
                           save_dir=tmp_path / "refused")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "learning rate (--lr) 0.002 -> 0.001 (checkpoint -> this run)" in refused.stderr
    assert "--override-opt_param-scheduler" in refused.stderr
    resumed = run_pretrain([*half, "--clip-grad", "0.9", "--override-opt_param-scheduler",
                            "--load", str(save)], nproc=nproc, save_dir=tmp_path / "resumed")
    assert "optimizer settings from this run's flags" in resumed.stdout
    assert "--clip-grad 1.0 -> 0.9" in resumed.stdout
    steps = resumed.records("train")
    assert [r["iteration"] for r in steps] == [3, 4]
    assert steps[0]["loss"] == straight[2]["loss"] and steps[1]["loss"] != straight[3]["loss"]
    fresh = run_pretrain(half, nproc=nproc, save_dir=tmp_path / "fresh").records("train")
    assert [r["lr"] for r in steps] == [r["lr"] for r in fresh[2:]]


def test_ckpt_step_rewinds_to_an_earlier_checkpoint(tiny, tmp_path):
    """Megatron-LM's --ckpt-step: saved at 2 and 4, rewound to 2 into the same folder, the run
    trains 3 and 4 again as it did (bitwise), replaces iteration 4 and says that the later
    checkpoint was of the run rewound from; an iteration never saved is refused in one line
    naming those that were, and --ckpt-step without --load before anything starts."""
    args = [*tiny, "--train-iters", "4", "--log-interval", "1", "--save-interval", "2"]
    save = tmp_path / "ckpt"
    first = [r["loss"] for r in run_pretrain(args, save_dir=save).records("train")]
    missing = run_pretrain([*args, "--load", str(save), "--ckpt-step", "3"], save_dir=save,
                           expect_success=False)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert f"--ckpt-step 3: no checkpoint of that iteration under --load {save}; it holds 2, 4" \
        in missing.stderr
    rewound = run_pretrain([*args, "--load", str(save), "--ckpt-step", "2"], save_dir=save)
    assert "at iteration 2" in rewound.stdout and "iteration(s) 4 under" in rewound.stdout
    assert [r["loss"] for r in rewound.records("train")][-2:] == first[2:]
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "4"
    alone = run_pretrain([*args, "--ckpt-step", "2"], expect_success=False)
    assert alone.returncode == 2 and "--ckpt-step picks an iteration" in alone.stderr
