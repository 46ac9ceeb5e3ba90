"""Every parallel layout trains the model the single process trains: the same seed, data and
global batch give the same first losses (fp32, dropout 0), each layout started from the command
line with only its layout flags changed. And the full initial model, gathered from the sharded
checkpoint, is the same tensor for tensor whatever the layout (layout-independent init)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from tests.conftest import TINY_GPT, report, run_pretrain

pytestmark = pytest.mark.slow

# 4 layers so that PP2 can hold 2 virtual stages; micro-batch 2 of a global batch of 8 gives
# PP2 its 4 micro-batches. No evaluation and no checkpoint: only the 3 training losses.
BASE = [*TINY_GPT, "--num-layers", "4", "--micro-batch-size", "2", "--eval-iters", "0",
        "--log-interval", "1"]
STEPS = ["--train-iters", "3"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear"]
TP2, PP2, EP2 = (["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"],
                 ["--expert-model-parallel-size", "2"])
SP, VPP2 = ["--sequence-parallel"], ["--num-layers-per-virtual-pipeline-stage", "1"]

DENSE_LAYOUTS = {
    "TP2": (2, TP2),
    "TP2+SP": (2, [*TP2, *SP]),
    "PP2": (2, PP2),
    "PP2+VPP2": (2, [*PP2, *VPP2]),
    # Uneven splits (the log line names the last stage's layers): 1 + 3 layers, and the
    # embedding and loss counted as layers, 6 units over 3 stages: 1 + 2 + 1 layers.
    "PP2 first 1": (2, [*PP2, "--decoder-first-pipeline-num-layers", "1"]),
    "PP3 embedding+loss": (3, ["--pipeline-model-parallel-size", "3",
                               "--account-for-embedding-in-pipeline-split",
                               "--account-for-loss-in-pipeline-split"]),
    "TP2xPP2": (4, [*TP2, *PP2]),
    "DP2xTP2": (4, TP2),
    # Context parallelism: megatron-core's batch split, our core attention (context_parallel.py).
    "CP2": (2, ["--context-parallel-size", "2"]),
    "CP2xTP2+SP": (4, ["--context-parallel-size", "2", *TP2, *SP]),
}
MOE_LAYOUTS = {
    "EP2": (2, EP2),
    "EP2+alltoall": (2, [*EP2, "--moe-token-dispatcher-type", "alltoall"]),
    # megatron-core's MoE layer needs sequence parallelism with TP; experts not TP-split.
    "EP2xTP2": (4, [*EP2, *TP2, *SP, "--expert-tensor-parallel-size", "1"]),
    # Experts split over the TP ranks too (expert TP = TP, megatron-core's default).
    "EP2xTP2+ETP2": (4, [*EP2, *TP2, *SP]),
    # 4 ranks: the experts split over EP2 and replicated over 2 expert-data-parallel ranks.
    "DP2xEP2": (4, EP2),
    # The experts folded over the TP x DP ranks (megatron-core's MoE parallel folding): EP4
    # across TP2 x DP2, one expert a rank, where EP x TP = 8 exceeds the 4 ranks.
    "TP2xDP2 with EP4 folded": (4, ["--expert-model-parallel-size", "4", *TP2, *SP,
                                     "--expert-tensor-parallel-size", "1"]),
}

@pytest.fixture(scope="module")
def references(data_cache) -> dict[str, list[float]]:
    runs = {"dense": [], "moe": MOE}
    return {name: run_pretrain([*BASE, *STEPS, "--data-cache-dir", data_cache, *extra])
            .logged_losses() for name, extra in runs.items()}


def _check(name: str, reference: list[float], got: list[float]) -> None:
    assert len(reference) == len(got) == 3, (reference, got)
    worst = max(abs(a - b) for a, b in zip(reference, got, strict=True))
    report(f"parallel equivalence {name}: max |loss - 1 process| over 3 steps {worst:.1e}")
    assert worst < 1e-4, f"{name}: 1 process {reference}, layout {got}"
    assert got[-1] < got[0]  # and it trains


@pytest.mark.parametrize("name", DENSE_LAYOUTS)
def test_dense_layout_matches_one_process(references, data_cache, name):
    nproc, flags = DENSE_LAYOUTS[name]
    run = run_pretrain([*BASE, *STEPS, "--data-cache-dir", data_cache, *flags], nproc=nproc)
    _check(name, references["dense"], run.logged_losses())
    last_stage = {"PP2 first 1": 3, "PP3 embedding+loss": 1}.get(name)
    if last_stage is not None:
        assert f"transformer layers on this rank: {last_stage};" in run.stdout


def test_uneven_interleaved_pipeline_matches_one_process(data_cache):
    """Uneven first/last stages under the interleaved schedule (Megatron-LM's
    --num-virtual-stages-per-pipeline-rank): 6 layers, the first rank's 2 in two chunks of 1,
    the last rank's 4 in two chunks of 2."""
    six = [*BASE, *STEPS, "--data-cache-dir", data_cache, "--num-layers", "6"]
    reference = run_pretrain(six).logged_losses()
    run = run_pretrain([*six, *PP2, "--decoder-first-pipeline-num-layers", "2",
                        "--num-virtual-stages-per-pipeline-rank", "2"], nproc=2)
    _check("PP2 first 2 + 2 chunks per rank", reference, run.logged_losses())
    assert "transformer layers on this rank: 4 (2 + 2 in 2 model chunks);" in run.stdout


def test_qk_layernorm_trains_the_same_under_tensor_parallelism(tmp_path, data_cache):
    """Query and key norms (--qk-layernorm, Qwen3's) act per head on each rank's heads, so
    their gradients must be summed over the TP group: after 3 steps of TP2, with SP (our
    SequenceParallelNorm) and without (megatron-core's own norm), the losses and every trained
    tensor, the norms' among them, are those of one process."""
    qk = [*BASE, *STEPS, "--data-cache-dir", data_cache, "--qk-layernorm",
          "--position-embedding-type", "rope", "--normalization", "RMSNorm",
          "--save-interval", "3", "--no-save-optim"]

    def trained(run) -> dict[str, torch.Tensor]:
        state = _load_state_dict_from_keys(checkpoint_id=str(run.save_dir / "iter_0000003"))
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}

    one = run_pretrain(qk, save_dir=tmp_path / "one")
    reference = trained(one)
    norms = [k for k in reference if "q_layernorm" in k or "k_layernorm" in k]
    # Stacked over the 4 layers: one [4, head width 16] tensor each for queries and keys.
    assert len(norms) == 2 and all(reference[k].shape == (4, 16) for k in norms)
    assert any((reference[k] != 1).any() for k in norms)  # they trained
    for name, flags in (("TP2+SP", [*TP2, *SP]), ("TP2", TP2)):
        run = run_pretrain([*qk, *flags], nproc=2, save_dir=tmp_path / name)
        _check(f"{name} qk-layernorm", one.logged_losses(), run.logged_losses())
        got = trained(run)
        assert got.keys() == reference.keys()
        diff = {k: (reference[k] - got[k]).abs().max().item() for k in reference}
        report(f"parallel equivalence {name} qk-layernorm: query/key norms after 3 steps "
               f"within {max(diff[k] for k in norms):.1e} of 1 process, every tensor "
               f"{max(diff.values()):.1e}")
        # Left partial (not summed over TP) the norms end 7e-3 apart while the first 3 losses
        # still agree within 2e-6; Adam turns float noise in near-zero gradients into 1e-5
        # elsewhere.
        assert max(diff[k] for k in norms) < 1e-6 and max(diff.values()) < 1e-4, name


@pytest.mark.parametrize("name", MOE_LAYOUTS)
def test_moe_layout_matches_one_process(references, data_cache, name):
    nproc, flags = MOE_LAYOUTS[name]
    run = run_pretrain([*BASE, *STEPS, "--data-cache-dir", data_cache, *MOE, *flags],
                       nproc=nproc)
    _check(f"MoE {name}", references["moe"], run.logged_losses())


def _initial_model(tmp_path, name: str, data_cache: str, nproc: int, flags: list[str]) -> dict:
    """The full model as initialized: one iteration whose update is skipped, then saved; the
    torch_dist checkpoint holds every tensor in its global (unsharded) shape."""
    save = tmp_path / name
    run_pretrain([*BASE, "--data-cache-dir", data_cache, "--train-iters", "1",
                  "--iterations-to-skip", "1", "--no-save-optim", *flags],
                 nproc=nproc, save_dir=save)
    state = _load_state_dict_from_keys(checkpoint_id=str(save / "iter_0000001"))
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


# SwiGLU in the dense model: its fc1 holds [gate; up] halves per TP rank (stride 2).
DENSE_GLU = ["--swiglu"]


@pytest.mark.parametrize(("model", "nproc", "flags"), [
    ("dense", 4, [*DENSE_GLU, *TP2, *PP2, *VPP2]),
    ("moe", 4, [*MOE, *EP2, *TP2, *SP]),  # experts split over TP too (expert TP = TP)
], ids=["SwiGLU-TP2xPP2xVPP2", "MoE-EP2xTP2"])
def test_initial_full_model_is_the_same_on_every_layout(tmp_path, data_cache, model, nproc,
                                                        flags):
    extra = MOE if model == "moe" else DENSE_GLU
    one = _initial_model(tmp_path, "one", data_cache, 1, extra)
    many = _initial_model(tmp_path, "many", data_cache, nproc, flags)
    assert one.keys() == many.keys() and len(one) > 10
    for key, tensor in one.items():
        assert torch.equal(tensor, many[key]), key


def test_interleaved_pipeline_resumes_bit_exactly(tmp_path, data_cache):
    """Checkpoints of model chunks: one model per virtual stage ("model0", "model1", as in
    Megatron-LM) with the distributed optimizer's state; 2 + 2 steps == 4 steps, bitwise."""
    args = [*BASE, "--data-cache-dir", data_cache, *PP2, *VPP2, "--use-distributed-optimizer",
            "--train-iters", "4"]
    straight = run_pretrain(args, nproc=2, save_dir=tmp_path / "straight")
    run_pretrain([*args, "--exit-interval", "2"], nproc=2, save_dir=tmp_path / "resumed")
    resumed = run_pretrain([*args, "--load", str(tmp_path / "resumed")], nproc=2,
                           save_dir=tmp_path / "resumed")
    assert len(straight.losses()) == 4
    assert resumed.losses() == straight.losses()
