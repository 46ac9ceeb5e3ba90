"""launch/emulate_cluster.py's command line: bad values are one line and exit 2 before any
namespace, bridge or process exists (so these run without root)."""

from __future__ import annotations

import pytest

from launch.emulate_cluster import parse_args

GOOD = ["--nodes", "2", "--gpus-per-node", "1", "--inter-gbit", "1"]


@pytest.mark.parametrize("extra,said", [
    (["--inter-gbit", "0"], "--inter-gbit must be finite and > 0"),
    (["--inter-gbit", "inf"], "--inter-gbit must be finite and > 0"),
    (["--inter-gbit", "nan"], "--inter-gbit must be finite and > 0"),
    (["--failure-timeout", "nan"], "--failure-timeout must be finite and >= 0"),
    (["--failure-timeout=-1"], "--failure-timeout must be finite and >= 0"),
    (["--nodes", "1"], "--nodes must be >= 2"),
])
def test_bad_values_are_one_line_before_anything_starts(extra: list[str], said: str,
                                                       capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args([*GOOD, *extra, "--", "true"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and said in err[0], err


def test_good_values_parse() -> None:
    args, command = parse_args([*GOOD, "--failure-timeout", "0", "--", "echo", "hi"])
    assert (args.nodes, args.inter_gbit, args.failure_timeout, command) == \
        (2, 1.0, 0.0, ["echo", "hi"])
