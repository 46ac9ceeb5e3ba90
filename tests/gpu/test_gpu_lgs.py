"""On one GPU: the LGS engine's CUDA path. Each bucket's two hops run on the intra- and
inter-node threads with that hop's own CUDA stream current (after waiting on the event recorded
before it), the step waits for both streams, nothing hangs, and the losses are plain DDP's.
Skipped where CUDA is absent."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO, _base_env
from tests.gpu.runs import LOCAL, device_env, max_difference, needs_cuda, run_on

pytestmark = needs_cuda

STEPS = ["--train-iters", "5", "--log-interval", "1", "--eval-iters", "0"]


def test_lgs_reduces_on_its_cuda_stream_and_matches_ddp(tiny, tmp_path, figures):
    plain = run_on("cuda", [*tiny, *LOCAL, *STEPS], tmp_path / "ddp").losses()
    save = tmp_path / "lgs"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests/gpu/lgs_probe.py"), *tiny, *LOCAL, *STEPS, "--lgs",
         "--save", str(save)], cwd=REPO, env={**_base_env(), **device_env("cuda")},
        capture_output=True, text=True, timeout=180)  # a hang fails here
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    probe = json.loads(proc.stdout.rsplit("LGS probe: ", 1)[1].splitlines()[0])
    lgs = [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()
           if json.loads(line)["event"] == "train"]
    figures("LGS reductions (5 steps)", probe["reductions"])
    figures("on the communication stream", probe["on_comm_stream"])
    figures("largest |LGS - DDP| loss difference", max_difference(lgs, plain))
    assert probe["reductions"] >= 5 and probe["hops"] == 2 * probe["reductions"], probe
    assert probe["threads"] == ["lgs-inter-node", "lgs-intra-node"], probe
    assert probe["on_comm_stream"] == probe["hops"] and probe["on_default_stream"] == 0
    assert max_difference(lgs, plain) <= 1e-6, (lgs, plain)
