"""Resharding on resume: a checkpoint with several gradient buckets, saved in one layout and
optimizer sharding, loads into another with every weight and optimizer state as saved, and the
next step's loss is the uninterrupted run's.

Each source layout trains 4 steps without stopping and saves at step 3 on the way. The target
layout loads step 3 twice: once skipping step 4 (`--iterations-to-skip 4`: nothing is computed or
changed, so the checkpoint it writes at step 4 is the state exactly as it was loaded, written
from the target layout's ranks) and once training step 4. Full global tensors are read back from
both checkpoints' files in this process, with torch.distributed.checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import pretrain_gpt  # megatron_lgs first: it prepares megatron-core for this machine
from megatron_lgs.arguments import parse_args
from tests.conftest import TINY_GPT, report, run_pretrain
from tests.distributed.checkpoint_files import global_tensors

pytestmark = pytest.mark.slow

# --overlap-grad-reduce makes --ddp-bucket-size count: 8 buckets per rank at TP2, 10 at DP1 and DP2.
BUCKETS = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "4000"]
# Log interval 2: the per-layer diagnostics are collectives over the pipeline stages too.
RUN = ["--train-iters", "4", "--log-interval", "2"]
LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "dp2": (2, []),
    # The weights outside a rank's shard are gathered in the next forward, so a save must
    # gather them first (until 2026-12-07 it wrote the step before's).
    "dp2-overlap-param-gather": (2, ["--overlap-param-gather"]),
    "dp1": (1, []),
    # MoE: at EP2 megatron gives the experts their own optimizer, at EP1 it has only one.
    "moe-ep2": (2, ["--num-experts", "4", "--disable-bias-linear",
                    "--expert-model-parallel-size", "2"]),
    "moe-ep1": (1, ["--num-experts", "4", "--disable-bias-linear"]),
    # The experts folded over the TP ranks: EP2 across TP2 on 2 ranks (expert TP 1).
    "moe-tp2-ep2-folded": (2, ["--num-experts", "4", "--disable-bias-linear",
                               "--tensor-model-parallel-size", "2", "--sequence-parallel",
                               "--expert-model-parallel-size", "2",
                               "--expert-tensor-parallel-size", "1"]),
    # An uneven pipeline split (1 + 2 of 3 layers) resumed in one process.
    "pp2-uneven": (2, ["--num-layers", "3", "--pipeline-model-parallel-size", "2",
                       "--decoder-first-pipeline-num-layers", "1"]),
    "dp1-3-layers": (1, ["--num-layers", "3"]),
    # The same PP size split another way (1 + 3 against 2 + 2 of 4 layers) is a new layout.
    "pp2-uneven-4": (2, ["--num-layers", "4", "--pipeline-model-parallel-size", "2",
                         "--decoder-first-pipeline-num-layers", "1"]),
    "pp2-4": (2, ["--num-layers", "4", "--pipeline-model-parallel-size", "2"]),
    # Uneven and interleaved: 2 + 4 of 6 layers, each rank's in 2 model chunks ("model0",
    # "model1"), resumed in one process.
    "pp2-uneven-vpp2": (2, ["--num-layers", "6", "--pipeline-model-parallel-size", "2",
                            "--decoder-first-pipeline-num-layers", "2",
                            "--num-virtual-stages-per-pipeline-rank", "2"]),
    "dp1-6-layers": (1, ["--num-layers", "6"]),
    # Layouts named "-plain" train with a plain optimizer (no --use-distributed-optimizer):
    # the same checkpoint format, so either sharding resumes the other.
    "tp2-plain": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2-plain": (2, ["--pipeline-model-parallel-size", "2"]),
    # At EP2 megatron chains a second plain optimizer for the experts too.
    "moe-ep2-plain": (2, ["--num-experts", "4", "--disable-bias-linear",
                          "--expert-model-parallel-size", "2"]),
    "moe-ep1-plain": (1, ["--num-experts", "4", "--disable-bias-linear"]),
    # SGD's per-parameter state is its momentum.
    "sgd-tp2-plain": (2, ["--optimizer", "sgd", "--tensor-model-parallel-size", "2"]),
    "sgd-pp2-plain": (2, ["--optimizer", "sgd", "--pipeline-model-parallel-size", "2"]),
    # bf16: megatron's Float16Optimizer keeps fp32 copies of the weights, as ZeRO-1 does.
    "bf16-dp2-plain": (2, ["--bf16"]),
    "bf16-dp1": (1, ["--bf16"]),
}
# The last case keeps the layout: the same format then resumes bit for bit.
CASES = [("tp2", "pp2"), ("dp2", "dp1"), ("dp1", "dp2"), ("moe-ep2", "moe-ep1"),
         ("moe-tp2-ep2-folded", "moe-ep1"), ("dp2-overlap-param-gather", "dp1"),
         ("pp2-uneven", "dp1-3-layers"), ("pp2-uneven-4", "pp2-4"),
         ("pp2-uneven-vpp2", "dp1-6-layers"), ("tp2", "pp2-plain"), ("tp2-plain", "dp2"),
         ("moe-ep2-plain", "moe-ep1-plain"), ("moe-ep2-plain", "moe-ep1"),
         ("sgd-tp2-plain", "sgd-pp2-plain"), ("bf16-dp2-plain", "bf16-dp1"), ("tp2", "tp2")]
ADAM_STATES = ("fp32_param", "exp_avg", "exp_avg_sq")
SGD_STATES = ("fp32_param", "momentum_buffer")


def _flags(name: str) -> tuple[int, list[str]]:
    """(ranks, flags) of a layout."""
    nproc, extra = LAYOUTS[name]
    buckets = BUCKETS
    if name.endswith("-plain"):
        buckets = [flag for flag in BUCKETS if flag != "--use-distributed-optimizer"]
    return nproc, [*buckets, *extra]


@pytest.fixture(scope="module")
def sources(tmp_path_factory, data_cache):
    """The uninterrupted 4-step run of a layout (checkpoint at step 3), run once per module."""
    runs = {}

    def run(name: str):
        if name not in runs:
            nproc, flags = _flags(name)
            save = tmp_path_factory.mktemp(f"source-{name}")
            runs[name] = run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *flags, *RUN,
                                       "--save-interval", "3"], nproc=nproc, save_dir=save)
        return runs[name]

    return run


def _load_dir(save: Path, iteration: int, dest: Path) -> Path:
    """A --load directory whose latest checkpoint is `iteration` of `save`."""
    name = f"iter_{iteration:07d}"
    shutil.copytree(save / name, dest / name)
    (dest / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return dest


def _adam_steps(checkpoint: Path) -> list[float]:
    common = torch.load(checkpoint / "common.pt", weights_only=True)
    return [group["step"] for optimizer in common["optimizer"]["common"]
            for group in optimizer["optimizer"]["param_groups"]]


@pytest.mark.parametrize("source,target", CASES, ids=[f"{s}-to-{t}" for s, t in CASES])
def test_resharded_resume_keeps_the_state_and_the_loss(sources, tiny, tmp_path, source, target):
    uninterrupted = sources(source)
    saved_dir = uninterrupted.save_dir / "iter_0000003"
    saved_layout = json.loads((saved_dir / "layout.json").read_text())
    # Several buckets on every rank (the uneven split's one-layer first stage has 2).
    assert min(saved_layout["grad_buckets_per_rank"]) >= (2 if "uneven" in source else 4)
    load = _load_dir(uninterrupted.save_dir, 3, tmp_path / "load")
    nproc, flags = _flags(target)
    args = [*tiny, *flags, *RUN, "--load", str(load)]

    as_loaded = run_pretrain([*args, "--iterations-to-skip", "4"], nproc=nproc,
                             save_dir=tmp_path / "as-loaded")
    assert ("layout changed from" in as_loaded.stdout) == (source != target)
    if source == "pp2-uneven-4":
        assert "PP2, 1..3 layers per rank x CP1" in as_loaded.stdout
    resaved_dir = tmp_path / "as-loaded" / "iter_0000004"
    target_layout = json.loads((resaved_dir / "layout.json").read_text())
    assert target_layout["world_size"] == nproc
    assert (target_layout == saved_layout) == (source == target)
    saved = global_tensors(saved_dir, tmp_path)
    resaved = global_tensors(resaved_dir, tmp_path)
    assert set(resaved) == set(saved)
    for state in SGD_STATES if "sgd" in source else ADAM_STATES:
        assert any(k.startswith(f"optimizer.state.{state}.") for k in saved), state
    worst = 0.0
    for key, tensor in saved.items():
        assert resaved[key].shape == tensor.shape, key
        worst = max(worst, (resaved[key] - tensor).abs().max().item())
        assert torch.allclose(resaved[key], tensor, rtol=0, atol=1e-6), key
    # One Adam step count for every parameter group (their number follows the layout).
    assert set(_adam_steps(resaved_dir)) == set(_adam_steps(saved_dir)) == \
        ({0} if "sgd" in source else {3})

    continued = run_pretrain(args, nproc=nproc, save_dir=tmp_path / "continued")
    (step,) = continued.records("train")
    assert step["iteration"] == 4 and not step["skipped"]
    loss_gap = abs(step["loss"] - uninterrupted.losses()[3])
    assert loss_gap <= 1e-4
    if source == target:
        assert step["loss"] == uninterrupted.losses()[3]  # bitwise
    if target == "pp2":  # both stages' layers in one per-layer line
        assert "grad norm per layer: embedding" in continued.stdout
        assert "layer 2" in continued.stdout
    report(f"reshard {source} -> {target} ({saved_layout['grad_buckets_per_rank']} -> "
           f"{target_layout['grad_buckets_per_rank']} buckets per rank): state max |diff| "
           f"{worst:.1e} over {len(saved)} tensors, next-step loss gap {loss_gap:.1e}")


def test_a_checkpoint_without_its_layout_record_is_refused_in_one_line(sources, tiny, tmp_path):
    load = _load_dir(sources("dp1").save_dir, 3, tmp_path / "load")
    (load / "iter_0000003" / "layout.json").unlink()
    refused = run_pretrain([*tiny, *BUCKETS, *RUN, "--load", str(load)], expect_success=False)
    assert refused.returncode == 2
    assert "layout.json" in refused.stderr and "Traceback" not in refused.stderr


def test_a_checkpoint_that_does_not_fit_is_refused_in_one_line(sources, tiny, tmp_path):
    # --finetune skips the fingerprint check, so only dist_checkpointing notices the shapes.
    load = _load_dir(sources("tp2").save_dir, 3, tmp_path / "load")
    refused = run_pretrain([*tiny, *BUCKETS, *RUN, "--hidden-size", "128", "--finetune",
                            "--load", str(load)], expect_success=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "saved as TP2 x PP1 x CP1 x DP1, EP1" in refused.stderr
    assert "cannot be read as TP1 x PP1 x CP1 x DP1, EP1" in refused.stderr
    assert "shape mismatch" in refused.stderr


def test_a_checkpoint_saved_without_its_optimizer_state_says_so(tiny, tmp_path):
    """A --no-save-optim checkpoint resumed with its optimizer state: until 2026-12-07 the error
    was dist_checkpointing's missing keys under "cannot be read as <the same layout>"."""
    saved = run_pretrain([*tiny, *BUCKETS, *RUN, "--exit-interval", "2", "--no-save-optim"],
                         save_dir=tmp_path / "saved")
    args = [*tiny, *BUCKETS, *RUN, "--load", str(saved.save_dir)]
    refused = run_pretrain(args, expect_success=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "saved with --no-save-optim and holds no optimizer state: add --no-load-optim" \
        in refused.stderr
    weights = run_pretrain([*args, "--no-load-optim"], save_dir=tmp_path / "weights")
    assert [r["iteration"] for r in weights.records("train")] == [3, 4]
    # The moments start afresh, the LR schedule goes on decaying from step 2 (Megatron-LM
    # restarts it).
    assert weights.records("train")[0]["lr"] < saved.records("train")[-1]["lr"]


def test_a_plain_optimizer_checkpoint_of_the_older_format_still_resumes(tiny, tmp_path):
    """Until 2026-12-07 a plain optimizer saved in megatron-core's own format: such a checkpoint
    resumes bit for bit into a plain optimizer, and is refused in one line by the distributed
    optimizer (that format does not reshard), and so is SGD's."""
    plain = [*tiny, *(flag for flag in BUCKETS if flag != "--use-distributed-optimizer"), *RUN]
    old = run_pretrain([*plain, "--save-interval", "3"], save_dir=tmp_path / "old",
                       module="tests.distributed.legacy_plain_save")
    layout = json.loads((old.save_dir / "iter_0000003" / "layout.json").read_text())
    assert "optimizer_format_version" not in layout
    load = _load_dir(old.save_dir, 3, tmp_path / "load")
    continued = run_pretrain([*plain, "--load", str(load)], save_dir=tmp_path / "continued")
    assert continued.records("train")[0]["loss"] == old.losses()[3]
    refused = run_pretrain([*tiny, *BUCKETS, *RUN, "--load", str(load)], expect_success=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "saved before 2026-12-07 by a plain optimizer" in refused.stderr
    # SGD's, which megatron-core cannot load at all (it died with a TypeError), says so.
    sgd = [*plain, "--optimizer", "sgd"]
    old_sgd = run_pretrain([*sgd, "--save-interval", "3"], save_dir=tmp_path / "old-sgd",
                           module="tests.distributed.legacy_plain_save")
    refused = run_pretrain([*sgd, "--load", str(old_sgd.save_dir)], expect_success=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "by --optimizer sgd in megatron-core's format" in refused.stderr


def test_finetune_from_another_tokenizer_is_refused_in_one_line(sources, tiny, tmp_path):
    """megatron-core loads word embeddings of another vocabulary size without a word (it lets
    the padding differ), so --finetune onto data of another tokenizer trained on rows of other
    tokens until the trainer compared the tokenizers."""
    load = _load_dir(sources("dp1").save_dir, 3, tmp_path / "load")
    vocab = tiny[tiny.index("--vocab-size") + 1]
    other = [*tiny[:tiny.index("--vocab-size")], "--vocab-size", str(int(vocab) + 256),
             *tiny[tiny.index("--vocab-size") + 2:]]
    refused = run_pretrain([*other, *BUCKETS, *RUN, "--finetune", "--load", str(load)],
                           expect_success=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "its tokenizer is not the one this run's data was tokenized with" in refused.stderr


def test_resume_after_the_data_cache_is_rebuilt_elsewhere(sources, tmp_path):
    """The default corpus, prepared again in another --data-cache-dir (another node's local
    disk, a cleared cache), is the same data: the run resumes and its next step is the
    uninterrupted run's, bit for bit. Until 2026-12-06 the rebuilt corpus's new temporary
    source folder changed the data fingerprint and the resume was refused."""
    uninterrupted = sources("dp1")
    load = _load_dir(uninterrupted.save_dir, 3, tmp_path / "load")
    elsewhere = [*TINY_GPT, "--data-cache-dir", str(tmp_path / "another-cache")]
    continued = run_pretrain([*elsewhere, *BUCKETS, *RUN, "--load", str(load)],
                             save_dir=tmp_path / "continued")
    (step,) = continued.records("train")
    assert step["iteration"] == 4 and step["loss"] == uninterrupted.losses()[3]


def test_a_checkpoint_with_the_older_data_fingerprint_still_resumes(sources, data_cache, tmp_path,
                                                                    one_rank_group):
    """Checkpoints saved before 2026-12-06 carry the data fingerprint of the manifests' own
    hashes (their input's folders included): the same data still resumes them; any other
    fingerprint is refused."""
    args = [*TINY_GPT, "--data-cache-dir", data_cache, *BUCKETS, *RUN]
    legacy = pretrain_gpt.datasets_provider(parse_args(args, world_size=1)).legacy_fingerprint
    uninterrupted = sources("dp1")
    for fingerprint, resumes in ((legacy, True), ("0" * 64 + "/" + "0" * 64, False)):
        load = _load_dir(uninterrupted.save_dir, 3, tmp_path / fingerprint[:8])
        state_file = load / "iter_0000003" / "run_state.json"
        state = json.loads(state_file.read_text())
        assert state["data_fingerprint"] != legacy
        state_file.write_text(json.dumps({**state, "data_fingerprint": fingerprint}))
        run = run_pretrain([*args, "--load", str(load)], save_dir=tmp_path / f"{resumes}",
                           expect_success=resumes)
        if resumes:
            assert run.records("train")[0]["loss"] == uninterrupted.losses()[3]
        else:
            assert run.returncode == 2 and "its data fingerprint" in run.stderr


def test_a_finished_run_resumed_says_there_is_nothing_left(sources, tiny, tmp_path):
    """A requeued job whose run already ended, or a lowered --train-iters (its decay kept, as the
    LR schedule may not change unasked): nothing to train, and the log says so instead of ending
    without a word."""
    load = _load_dir(sources("dp1").save_dir, 3, tmp_path / "load")
    done = run_pretrain([*tiny, *BUCKETS, "--train-iters", "3", "--lr-decay-iters", "4",
                         "--load", str(load)], save_dir=tmp_path / "again")
    assert "iteration 3 of the checkpoint is at or past --train-iters 3" in done.stdout
    assert not done.records("train")
