"""The layout planner on the configs a user brings: a Hugging Face config (its folder or its
config.json), a launch config of their own in its own precision, and the one-line errors for
what it cannot read or time (the search and its answers: test_planner.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from megatron_lgs.arguments import build_parser, config_from_namespace
from megatron_lgs.lgs.plan_models import resolve
from megatron_lgs.lgs.plan_run import main as plan_main
from megatron_lgs.lgs.stepmodel import predict_run
from megatron_lgs.validation import validate
from megatron_lgs.vocab_padding import padded_vocab_size

ROOT = Path(__file__).resolve().parents[3]


def _hf_llama(folder: Path) -> Path:
    """A Llama-shaped Hugging Face config (GQA, untied, RoPE theta of Llama 3), no weights."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                max_position_embeddings=8192, rope_theta=500000.0,
                tie_word_embeddings=False).save_pretrained(folder)
    return folder


def test_planner_plans_a_hugging_face_config(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    """A Hugging Face model (its folder or its config.json) is planned as its config says, at
    the training length and batch given, and its flag line passes the trainer's validation."""
    from transformers import Qwen3MoeConfig

    folder = _hf_llama(tmp_path / "llama")
    base, ref = resolve(str(folder / "config.json"), "a100-80gb", 16, 64, None, 8, 2048)
    assert ref is None and base.global_batch == 64
    assert (base.num_layers, base.hidden, base.ffn_hidden, base.heads, base.kv_heads, base.vocab,
            base.seq_length) == (16, 2048, 5632, 16, 4, 32000, 2048)
    assert base.swiglu and base.untie_embeddings and base.position_embedding == "rope"
    plan_main(["--model", str(folder), "--gpus", "16", "--hardware", "a100-80gb",
               "--global-batch", "64", "--seq-length", "2048", "--top", "1"])
    flags = next(line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("best flags: ")).split()[2:]
    cfg = config_from_namespace(build_parser().parse_args(flags), 16)
    validate(cfg)
    m = cfg.model
    assert (m.seq_length, m.max_position_embeddings, m.rotary_base, m.query_groups,
            cfg.precision.bf16) == (2048, 8192, 500000, 4, True)
    # The model's embedding is the one the trainer builds from those flags, at any TP.
    for tp in (1, 4, 8):
        assert replace(base, tp=tp).padded_vocab == padded_vocab_size(
            cfg.data.vocab_size, m.make_vocab_size_divisible_by, tp)
    assert replace(base, tp=8).padded_vocab == 32768
    Qwen3MoeConfig(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=128, moe_intermediate_size=256,
                   num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, vocab_size=32000,
                   tie_word_embeddings=False).save_pretrained(tmp_path / "moe")
    moe, _ = resolve(str(tmp_path / "moe"), "h100-sxm", 16, 64, None, 8, 4096)
    assert (moe.num_experts, moe.moe_topk, moe.moe_ffn_hidden, moe.head_dim) == (32, 4, 256, 128)
    assert moe.qk_layernorm


@pytest.mark.parametrize("extra,said", [
    (["--global-batch", "64"], "has no training length or batch: give --seq-length and"),
    (["--seq-length", "2048"], "has no training length or batch: give --seq-length and"),
    (["--global-batch", "64", "--seq-length", "16384"],
     "--max-position-embeddings (8192) is smaller than --seq-length (16384)"),
])
def test_planner_on_a_hugging_face_config_says_what_is_missing(
        extra: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = _hf_llama(tmp_path / "llama")
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(folder), "--gpus", "16", "--hardware", "a100-80gb", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and said in err[0], err


def test_planner_refuses_a_hugging_face_model_it_cannot_express(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(tmp_path / "bert"), "--gpus", "8", "--hardware", "h100-sxm",
                   "--global-batch", "8", "--seq-length", "512"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "model type 'bert' has no" in err[0], err


def test_planner_on_a_config_bash_cannot_source_is_one_line(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "mine.sh").write_text("CONFIG_ARGS=(\n  --num-layers 2\n")  # unclosed
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(tmp_path / "mine.sh"), "--gpus", "8", "--hardware",
                   "a100-80gb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "could not source it" in err[0], err


def test_planner_names_the_config_whose_flags_are_bad(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "mine.sh").write_text("CONFIG_ARGS=(--num-layers 2 --no-such-flag)\n")
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(tmp_path / "mine.sh"), "--gpus", "8", "--hardware",
                   "a100-80gb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"plan_run: launch config {tmp_path / 'mine.sh'}: error: "), err
    assert "--no-such-flag" in err[0], err


@pytest.mark.parametrize("flag", ["--optimizer-cpu-offload",
                                  "--reduce-scatter-with-fp32-accumulation",
                                  "--num-distributed-optimizer-instances 2 --no-save"])
def test_planner_refuses_optimizer_options_it_does_not_time(flag: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    """Each needs a ZeRO-1 layout; planned as if unset, the 10B's best (ZeRO-3) flag line with
    the option would fail the trainer's validation."""
    config = Path("launch/configs/gpt-10b.sh").read_text()
    (tmp_path / "mine.sh").write_text(config.replace("--loss-spike-action skip",
                                                     f"--loss-spike-action skip {flag}"))
    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", str(tmp_path / "mine.sh"), "--gpus", "16", "--hardware",
                   "a100-80gb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert f"sets {flag.split()[0]}: the step model does not time" in err[0], err


def _own_config(tmp_path: Path, extra: str) -> str:
    """A user's launch config beside none of launch/configs/: gpt-10b.sh plus `extra`."""
    text = (ROOT / "launch/configs/gpt-10b.sh").read_text().replace("--bf16", f"--bf16 {extra}")
    path = tmp_path / "my-model.sh"
    path.write_text(text)
    return str(path)


def test_planner_takes_a_users_config_in_its_own_precision(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """A config outside launch/configs/ is read at the GPU count asked for, and planned in its
    precision: FP8 with the trainer's recipe, refused in one line on a GPU without FP8."""
    for extra, recipe in (("--fp8-format hybrid", "delayed"),
                          ("--fp8-format hybrid --fp8-recipe tensorwise", "current")):
        base, ref = resolve(_own_config(tmp_path, extra), "h100-sxm", 16, None, None)
        assert (base.precision, base.fp8_recipe, base.fp8_params) == ("fp8", recipe, False)
        assert ref is not None and (ref.tp, ref.pp, ref.dp) == (4, 2, 2)
    plain, _ = resolve(_own_config(tmp_path, ""), "h100-sxm", 16, None, None)
    assert plain.precision == "bf16"
    assert predict_run(replace(ref, precision="fp8")).step_time_s < \
        predict_run(replace(ref, precision="bf16")).step_time_s
    for gpu, extra, said in (("a100-80gb", "--fp8-format hybrid", "has no tensor cores for"),
                             ("h100-sxm", "--fp8-format hybrid --fp8-recipe blockwise",
                              "--fp8-recipe blockwise")):
        with pytest.raises(SystemExit) as exc:
            plan_main(["--model", _own_config(tmp_path, extra), "--gpus", "16", "--hardware",
                       gpu])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and said in err[0], err
