"""Session fixtures of the two-node tests: one emulated cluster (2 nodes x 2 ranks, 1 Gbit/s
links) and the reference runs several modules compare with."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_pretrain
from tests.distributed.multinode import FLAGS, losses_by_iteration, torchrun_on_nodes
from tests.distributed.slurm_cluster import SlurmCluster, ensure_installed, make_root


@pytest.fixture(scope="session")
def emulated_2x2() -> Iterator:
    from launch.emulate_cluster import emulated_cluster, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"emulated cluster unavailable: {reason}")
    with emulated_cluster(nodes=2, gpus_per_node=2, inter_gbit=1.0) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def one_process_losses(tmp_path_factory, data_cache) -> dict[int, float]:
    save = tmp_path_factory.mktemp("one-process")
    run_pretrain([*FLAGS, "--data-cache-dir", data_cache], save_dir=save)
    return losses_by_iteration(save)


@pytest.fixture(scope="session")
def two_node_dp4(emulated_2x2, tmp_path_factory, data_cache) -> tuple[dict[int, float], str]:
    """DP4 across the two nodes, uninterrupted: (losses, both nodes' output)."""
    save: Path = tmp_path_factory.mktemp("two-node-dp4")
    exits, logs = torchrun_on_nodes(
        emulated_2x2, [*FLAGS, "--data-cache-dir", data_cache, "--save", str(save)],
        save / "logs")
    assert exits.status == 0, logs[-4000:]
    return losses_by_iteration(save), logs


@pytest.fixture(scope="session")
def slurm_single() -> Iterator[SlurmCluster]:
    """One real single-node Slurm cluster (slurmctld, slurmd, munged on this machine) for the
    session: the launch tests and the Slurm executor of `prepare` share it."""
    import shutil

    ensure_installed()
    root = make_root("lgs-slurm-")
    cluster = SlurmCluster.single_node(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
