"""torchrun across 2 emulated nodes x 2 ranks (launch/emulate_cluster.py): DP4, TP2 x DP2 with TP
inside the node, and --lgs with the ranks per node read from torchrun's environment, each with
the losses of one process."""

from __future__ import annotations

import pytest

from tests.distributed.multinode import FLAGS, TRAIN_ITERS, losses_by_iteration, torchrun_on_nodes

pytestmark = pytest.mark.slow


def _assert_close(losses: dict[int, float], reference: dict[int, float]) -> None:
    assert sorted(losses) == list(range(1, TRAIN_ITERS + 1))
    assert sorted(reference) == sorted(losses)
    worst = max(abs(losses[i] - reference[i]) for i in losses)
    assert worst <= 1e-5, (worst, losses, reference)


def test_dp4_across_two_nodes_matches_one_process(two_node_dp4, one_process_losses):
    losses, logs = two_node_dp4
    assert "= TP 1 x PP 1 x CP 1 x DP 4" in logs
    _assert_close(losses, one_process_losses)


@pytest.mark.parametrize("name,extra,layout", [
    ("tp2xdp2", ["--tensor-model-parallel-size", "2"], "= TP 2 x PP 1 x CP 1 x DP 2"),
    ("lgs", ["--lgs", "--lgs-intra-threshold-mb", "0.05", "--lgs-inter-threshold-mb", "0.02"],
     "= TP 1 x PP 1 x CP 1 x DP 4"),
], ids=["tp2xdp2", "lgs"])
def test_layout_across_two_nodes_matches_one_process(name, extra, layout, emulated_2x2,
                                                     one_process_losses, tmp_path, data_cache):
    save = tmp_path / name
    exits, logs = torchrun_on_nodes(
        emulated_2x2, [*FLAGS, *extra, "--data-cache-dir", data_cache, "--save", str(save)],
        tmp_path / "logs")
    assert exits.status == 0, logs[-4000:]
    assert layout in logs
    if name == "lgs":
        # Ranks per node from torchrun's LOCAL_WORLD_SIZE; the DP group seen as 2 nodes x 2.
        assert "LGS: 2 ranks per node (LOCAL_WORLD_SIZE)" in logs, logs[-4000:]
        assert "data-parallel group of 4 = 2 nodes x 2" in logs
    _assert_close(losses_by_iteration(save), one_process_losses)
