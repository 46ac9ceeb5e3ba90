"""Why the trainer refuses expert TP other than TP at EP 1 (`validation_moe.validate_experts`):
megatron-core 0.16.1 marks a layer's weights as the experts' (`allreduce` False: reduced over the
expert data-parallel group, in the experts' own optimizer) only when EP > 1. Measured before the
refusal, TP2 with expert TP 1 at EP 1 on 2 ranks: losses 6.2575, 6.1945, 6.1174 where one process
and EP2 x TP2 with expert TP 1 give 6.2575, 6.1903, 6.1101. Upstream takes the experts' groups
wherever expert TP differs from TP (Megatron-LM #5916, 2026-07-25); once the pinned version does,
this test fails and the refusal can go."""

from __future__ import annotations

import inspect

import pytest

from megatron_lgs.arguments import parse_args  # before megatron.core: it patches it for CPU


def _layers():
    from megatron.core.tensor_parallel import layers

    return layers


@pytest.mark.parametrize("cls", ["ColumnParallelLinear", "RowParallelLinear"])
def test_megatron_core_takes_the_expert_groups_only_at_ep_above_one(cls) -> None:
    cls = getattr(_layers(), cls)
    source = inspect.getsource(cls.__init__)
    assert "self.expert_parallel = config.expert_model_parallel_size > 1" in source
    assert 'setattr(self.weight, "allreduce", not (self.is_expert and self.expert_parallel))' \
        in source
    assert "expert_tensor_parallel_size" not in source


def test_the_grouped_local_experts_too() -> None:
    from megatron.core.transformer.moe import experts

    source = inspect.getsource(experts)
    assert "self.expert_parallel = config.expert_model_parallel_size > 1" in source
    assert "setattr(self.weight1, 'allreduce', not self.expert_parallel)" in source


@pytest.mark.parametrize("tp,etp", [(2, 1), (1, 2)])
def test_expert_tp_other_than_tp_at_ep_one_is_refused(tp, etp, capsys) -> None:
    argv = ["--num-experts", "4", "--disable-bias-linear", "--tensor-model-parallel-size",
            str(tp), "--expert-tensor-parallel-size", str(etp)]
    argv += ["--sequence-parallel"] if tp > 1 else []
    with pytest.raises(SystemExit):
        parse_args(argv, world_size=2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs --expert-model-parallel-size > 1" in err[0]
    # The same expert layout at EP 2 trains as one process does (test_parallel_equivalence).
    parse_args([*argv, "--expert-model-parallel-size", "2", "--micro-batch-size", "2"],
               world_size=4)
