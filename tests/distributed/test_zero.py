"""ZeRO stages on CPU with real processes, measured from the tensors each rank holds: the
distributed optimizer (ZeRO-1/2) halves the optimizer state at DP=2, Megatron-FSDP's
optim_grads_params (ZeRO-3) halves parameters and gradients too, and both train exactly like
one process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, TINY_GPT, _base_env, report, run_pretrain

pytestmark = pytest.mark.slow

STEPS = ["--train-iters", "4", "--log-interval", "2"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data_cache):
    return run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *STEPS],
                        save_dir=tmp_path_factory.mktemp("dp1"))


def _memory(run, event: str) -> list[dict[str, int]]:
    (record,) = run.records(event)
    return record["per_rank"]


def test_distributed_optimizer_holds_half_the_optimizer_state_per_rank(one_process, tiny,
                                                                       tmp_path):
    run = run_pretrain([*tiny, *STEPS, "--use-distributed-optimizer"], nproc=2,
                       save_dir=tmp_path / "c")
    (full,) = _memory(one_process, "memory")
    ranks = _memory(run, "memory")
    assert ranks[0] == ranks[1]
    # Adam's moments (and no separate main weights in fp32): exactly half each, up to the
    # padding megatron adds to make buckets divisible by DP.
    assert 0 <= 2 * ranks[0]["optimizer_state"] - full["optimizer_state"] < \
        0.001 * full["optimizer_state"]
    assert ranks[0]["parameters"] == full["parameters"]
    assert ranks[0]["gradients"] == full["gradients"]
    report(f"ZeRO-1 DP=2: optimizer state per rank {ranks[0]['optimizer_state']} B, "
           f"one process {full['optimizer_state']} B")
    assert run.losses() == pytest.approx(one_process.losses(), abs=1e-5)


@pytest.mark.parametrize("nproc,extra", [(1, []), (2, []), (2, ["--use-distributed-optimizer"])])
def test_start_up_memory_report_is_what_the_first_step_holds(tiny, tmp_path, nproc, extra):
    run = run_pretrain([*tiny, "--train-iters", "1", *extra], nproc=nproc,
                       save_dir=tmp_path / "c")
    assert _memory(run, "memory_startup") == _memory(run, "memory")
    assert " memory per rank at start-up (MB): parameters " in run.stdout


# torchrun runs this script, which trains through the real Trainer (without checkpoints) with a
# metrics file of its own and records what each rank holds at start-up.
_FSDP_RUN = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    import megatron_lgs
    import pretrain_gpt
    from megatron_lgs import memory, metrics
    from megatron_lgs.arguments import parse_args
    from megatron_lgs.training import Trainer

    out, argv = sys.argv[1], sys.argv[2:]
    trainer = Trainer(parse_args([*argv, "--no-save"]), pretrain_gpt.model_provider,
                      pretrain_gpt.forward_step, pretrain_gpt.datasets_provider)
    startup = memory.gather(memory.startup_memory_bytes(trainer.model, trainer.optimizer, "adam"))
    last = dist.get_rank() == dist.get_world_size() - 1
    trainer.log.metrics_file = metrics.MetricsFile(f"{out}/metrics.jsonl" if last else None)
    trainer.train()
    if last:
        with open(f"{out}/startup.json", "w") as f:
            json.dump(startup, f)
""")


def _fsdp_run(tmp_path, data_cache, strategy: str):
    script = tmp_path / "fsdp_run.py"
    script.write_text(_FSDP_RUN)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script), str(out), *TINY_GPT, "--data-cache-dir", data_cache, *STEPS,
         "--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy],
        cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["event"] == "train"]
    (held,) = [r["per_rank"] for r in records if r["event"] == "memory"]
    startup = json.loads((out / "startup.json").read_text())
    return losses, held, startup, records


@pytest.mark.parametrize("strategy,params_fraction", [("optim_grads_params", 0.5),
                                                      ("optim_grads", 1.0)])
def test_megatron_fsdp_shards_what_its_strategy_says_and_trains_like_one_process(
        one_process, data_cache, tmp_path, strategy, params_fraction):
    losses, held, startup, records = _fsdp_run(tmp_path, data_cache, strategy)
    assert losses == pytest.approx(one_process.losses(), abs=1e-5)
    assert held == startup
    (full,) = _memory(one_process, "memory")
    for rank in held:
        # Each rank's share, up to Megatron-FSDP's padding of its buffers.
        assert abs(rank["parameters"] - params_fraction * full["parameters"]) < \
            0.01 * full["parameters"], (rank, full)
        assert abs(rank["gradients"] - 0.5 * full["gradients"]) < 0.01 * full["gradients"]
    report(f"Megatron-FSDP {strategy} DP=2: parameters per rank "
           f"{[r['parameters'] for r in held]} B, one process {full['parameters']} B")
    # The per-layer diagnostics read the gradient shards and agree with one process.
    ours = [r for r in records if r["event"] == "log"]
    theirs = one_process.records("log")
    for a, b in zip(ours, theirs, strict=True):
        assert a["grad_norm.layer_1"] == pytest.approx(b["grad_norm.layer_1"], rel=1e-4)
        assert a["update.param_ratio"] == pytest.approx(b["update.param_ratio"], rel=1e-4)
