"""MoE expert load and auxiliary losses, end to end: what the log reports is what the routers
did, the capacity factor drops (and counts) tokens, and the load-balancing loss reaches the
router's gradient in proportion to its coefficient."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import REPO, TINY_GPT, _base_env, run_pretrain

pytestmark = pytest.mark.slow

MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear",
       "--train-iters", "4", "--log-interval", "2"]
SEQ, GLOBAL_BATCH, TOPK, LAYERS = 64, 8, 2, 2
ASSIGNMENTS_PER_INTERVAL = 2 * GLOBAL_BATCH * SEQ * TOPK  # 2 iterations per log interval


def _moe_records(run) -> list[dict]:
    records = run.records("moe")
    assert [r["iteration"] for r in records] == [2, 4]
    return records


@pytest.mark.parametrize("nproc,extra", [(1, []), (2, ["--expert-model-parallel-size", "2"])])
def test_dropless_routing_counts_every_token_once(tiny, tmp_path, nproc, extra):
    run = run_pretrain([*tiny, *MOE, *extra], nproc=nproc, save_dir=tmp_path / "c")
    for record in _moe_records(run):
        for layer in range(1, LAYERS + 1):
            tokens = record[f"tokens_per_expert.layer_{layer}"]
            assert record[f"dropped.layer_{layer}"] == 0
            assert sum(tokens) == ASSIGNMENTS_PER_INTERVAL  # global: both ranks' tokens
            assert record[f"imbalance.layer_{layer}"] == max(tokens) * 4 / sum(tokens)
            assert math.isfinite(record[f"load_balancing_loss.layer_{layer}"])
    assert "moe layer 2 | tokens per expert: " in run.stdout
    assert "| dropped tokens: 0 | load_balancing_loss: " in run.stdout


def test_capacity_factor_below_one_drops_tokens_and_counts_them(tiny, tmp_path):
    run = run_pretrain([*tiny, *MOE, "--moe-expert-capacity-factor", "0.5"],
                       save_dir=tmp_path / "c")
    # Capacity per expert and micro-batch: 0.5 x (4 x 64 tokens x top-2) / 4 experts = 64.
    capacity = 64 * 2 * 2  # two micro-batches per step, two steps per interval
    for record in _moe_records(run):
        for layer in range(1, LAYERS + 1):
            tokens = record[f"tokens_per_expert.layer_{layer}"]
            dropped = record[f"dropped.layer_{layer}"]
            assert max(tokens) <= capacity
            assert dropped >= ASSIGNMENTS_PER_INTERVAL - 4 * capacity > 0
            assert sum(tokens) + dropped == ASSIGNMENTS_PER_INTERVAL


def test_aux_loss_is_logged_only_when_its_coefficient_is_set(tiny, tmp_path):
    off = run_pretrain([*tiny, *MOE, "--moe-aux-loss-coeff", "0"], save_dir=tmp_path / "off")
    for record in _moe_records(off):
        assert not any(key.startswith("load_balancing_loss") for key in record)
    on = run_pretrain([*tiny, *MOE, "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff",
                       "0.001"], save_dir=tmp_path / "on")
    for record in _moe_records(on):
        for layer in range(1, LAYERS + 1):
            # The balance term of the Switch loss: about 1 for an even split, never below 0.
            assert 0.5 < record[f"load_balancing_loss.layer_{layer}"] < 4
            assert record[f"z_loss.layer_{layer}"] > 0
    assert off.losses() != on.losses()


# One process builds the trainer and backpropagates the same global batch with three
# coefficients, through megatron's own schedule; it saves each parameter's reduced gradient.
_GRADIENTS = textwrap.dedent("""
    import itertools, sys
    import torch
    import megatron_lgs
    import pretrain_gpt
    from megatron.core.transformer.moe.router import Router
    from megatron.core.utils import unwrap_model
    from megatron_lgs import data
    from megatron_lgs.arguments import parse_args
    from megatron_lgs.training import Trainer

    out, argv = sys.argv[1], sys.argv[2:]
    cfg = parse_args([*argv, "--no-save"])
    trainer = Trainer(cfg, pretrain_gpt.model_provider, pretrain_gpt.forward_step,
                      pretrain_gpt.datasets_provider)
    t = cfg.training
    sampler = data.MicroBatchSampler(0, trainer.batch_sizes, t.micro_batch_size, 0, 1)
    batch = list(itertools.islice(data.micro_batch_stream(trainer.datasets.train, sampler, 0),
                                  trainer.num_microbatches))
    [model] = trainer.model
    routers = [m for m in unwrap_model(model).modules() if isinstance(m, Router)]
    grads = {}
    for coeff in (0.0, 0.01, 0.02):
        for router in routers:
            router.config.moe_aux_loss_coeff = coeff
        model.zero_grad_buffer()
        trainer.forward_backward(
            forward_step_func=pretrain_gpt.forward_step, data_iterator=iter(batch),
            model=[model], num_microbatches=trainer.num_microbatches,
            seq_length=cfg.model.seq_length, micro_batch_size=t.micro_batch_size,
            forward_only=False)
        grads[coeff] = {name: p.main_grad.clone()
                        for name, p in unwrap_model(model).named_parameters()}
    torch.save(grads, out)
""")


def test_aux_loss_gradient_reaches_the_router_in_proportion_to_its_coefficient(data_cache,
                                                                              tmp_path):
    out = tmp_path / "grads.pt"
    proc = subprocess.run(
        [sys.executable, "-c", _GRADIENTS, str(out), *TINY_GPT, *MOE, "--data-cache-dir",
         data_cache], cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grads = torch.load(out, weights_only=True)
    g0, g1, g2 = grads[0.0], grads[0.01], grads[0.02]
    routers = [name for name in g0 if name.endswith("router.weight")]
    assert len(routers) == LAYERS
    for name in routers:
        aux_1, aux_2 = g1[name] - g0[name], g2[name] - g0[name]
        assert aux_1.norm() > 1e-3 * g0[name].norm() > 0, name
        # The aux term is linear in its coefficient: twice the coefficient, twice the gradient.
        torch.testing.assert_close(aux_2, 2 * aux_1, rtol=1e-3, atol=1e-9)
    # The loss is attached to the last router's probabilities only: the experts after it see
    # the language-model gradient alone, bit for bit.
    last_experts = [n for n in g0 if n.startswith(f"decoder.layers.{LAYERS - 1}.mlp.experts")]
    assert last_experts
    for name in last_experts:
        assert torch.equal(g0[name], g2[name]), name
