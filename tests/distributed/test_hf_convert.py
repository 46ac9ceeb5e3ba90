"""Hugging Face export / import and generation, on real training runs.

One tiny run per architecture (GPT-2-, Llama-, GQA- and Mixtral-style), one TP2 x PP2 run, all
started at once and shared by the module. Logits and generations are compared in this process
against `transformers` reading the exported directory; the three command lines run once each as
a user runs them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from data_pipeline.embedded import prepare_embedded

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may download

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import megatron_lgs  # noqa: E402,F401
from megatron_lgs import generate as gen  # noqa: E402
from megatron_lgs import model_record  # noqa: E402
from megatron_lgs.convert import __main__ as convert_cli  # noqa: E402
from megatron_lgs.convert import checkpoint_io, export, import_hf  # noqa: E402
from tests.conftest import REPO, TINY_GPT, _base_env, report, run_pretrain  # noqa: E402

ROPE = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu"]
# A larger init spreads the logits, so greedy decoding walks through many different tokens
# (a near-uniform tiny model repeats one) and MoE routing differs from token to token.
SPREAD = ["--init-method-std", "0.2"]
ARCHS = {
    "gpt2": [],  # learned positions + LayerNorm + GELU + biases, tied
    # OpenAI's GPT-2 itself: GELU's tanh approximation (transformers' gelu_new).
    "gpt2-tanh": ["--openai-gelu", *SPREAD],
    # Llama 3.1's RoPE: period 500000 (transformers' rope_theta), low frequencies scaled by
    # 32 as Llama 3.2 1B/3B scale them (rope_type "llama3").
    "llama": [*ROPE, "--disable-bias-linear", "--untie-embeddings-and-output-weights",
              "--rotary-base", "500000", "--use-rope-scaling", "--rope-scaling-factor", "32",
              *SPREAD],
    # Heads of 32 on a hidden size of 64 with 4 heads (--kv-channels; transformers' head_dim).
    "gqa": [*ROPE, "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "32",
            *SPREAD],
    # Qwen2's: biases on Q, K and V only, theta 1e6, epsilon 1e-6, GQA.
    "qwen2": [*ROPE, "--disable-bias-linear", "--add-qkv-bias", "--rotary-base", "1000000",
              "--norm-epsilon", "1e-6", "--group-query-attention", "--num-query-groups", "2",
              *SPREAD],
    # Qwen3's shape: query/key norms, heads of 32, theta 1e6, epsilon 1e-6, GQA.
    "qwen3": [*ROPE, "--disable-bias-linear", "--qk-layernorm", "--kv-channels", "32",
              "--rotary-base", "1000000", "--norm-epsilon", "1e-6", "--group-query-attention",
              "--num-query-groups", "2", *SPREAD],
    # Qwen3-MoE's shape: Qwen3's attention, 4 experts of 32 (narrower than the hidden 64).
    "qwen3moe": [*ROPE, "--disable-bias-linear", "--qk-layernorm", "--kv-channels", "32",
                 "--rotary-base", "1000000", "--norm-epsilon", "1e-6", "--num-experts", "4",
                 "--moe-ffn-hidden-size", "32", "--moe-aux-loss-coeff", "1e-3",
                 "--group-query-attention", "--num-query-groups", "2", *SPREAD],
    # A norm epsilon other than megatron-core's 1e-5 (transformers' rms_norm_eps).
    "moe": [*ROPE, "--disable-bias-linear", "--num-experts", "4", "--moe-ffn-hidden-size", "64",
            "--group-query-attention", "--num-query-groups", "2", "--norm-epsilon", "1e-3",
            *SPREAD],
}
TP2PP2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
PROMPTS = ["def main(", "The quick brown fox", "import os\nimport sys\n"]
# Every test here reads the shared runs, one of which starts 4 ranks.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_cache) -> dict[str, Path]:
    """Save directories: 3 iterations, checkpoints at 2 and 3; `gqa-tp2pp2` on 4 ranks."""
    root = tmp_path_factory.mktemp("hf-runs")
    base = [*TINY_GPT, "--data-cache-dir", data_cache, "--train-iters", "3", "--save-interval",
            "2", "--log-interval", "1"]
    prepare_embedded(data_cache, 512)  # once, before the concurrent runs read it
    jobs = {name: (flags, 1) for name, flags in ARCHS.items()}
    jobs["gqa-tp2pp2"] = ([*ARCHS["gqa"], *TP2PP2], 4)
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(run_pretrain, [*base, *flags], nproc=nproc,
                                     save_dir=root / name)
                   for name, (flags, nproc) in jobs.items()}
        return {name: f.result().save_dir for name, f in futures.items()}


@pytest.fixture(scope="module")
def world():
    with checkpoint_io.single_process():
        yield


@pytest.fixture(scope="module")
def sources(runs) -> dict[str, Path]:
    """What each export reads: the latest checkpoint; for llama iteration 2, so that the round
    trip has a next step to compare."""
    return {**runs, "llama": runs["llama"] / "iter_0000002"}


@pytest.fixture(scope="module")
def exported(sources, world, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-out")
    return {name: export.to_hf(source, root / name) for name, source in sources.items()
            if name != "llama"} | {"llama": _cli_export(sources["llama"], root / "llama")}


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=REPO,
                          env=_base_env(), capture_output=True, text=True, timeout=300)


def _cli_export(save: Path, out: Path) -> Path:
    """The command line, once (the other exports call the same function in this process)."""
    proc = _cli("megatron_lgs.convert", "to-hf", save, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _ours(save: Path) -> tuple[torch.nn.Module, model_record.ModelRecord]:
    directory = checkpoint_io.resolve(save)
    record = checkpoint_io.read_record(directory)
    return checkpoint_io.load_full_model(directory, record), record


def _hf(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


@pytest.mark.parametrize("name", [*ARCHS, "gqa-tp2pp2"])
def test_logit_parity(name, sources, exported):
    """transformers' logits on the exported model equal ours within 1e-4 (fp32), the padded
    vocabulary cut; the directory is what `from_pretrained` reads offline."""
    ours, record = _ours(sources[name])
    hf = _hf(exported[name])
    assert hf.config.vocab_size == record.vocab_size
    tokens = torch.randint(0, record.vocab_size, (2, 48),
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mine = ours(tokens, torch.arange(48).expand(2, 48), None)[..., :record.vocab_size]
        theirs = hf(tokens).logits
    assert mine.shape == theirs.shape
    difference = (mine - theirs).abs().max().item()
    report(f"HF export {name}: max |logit difference| {difference:.1e} (limit 1e-4)")
    assert difference < 1e-4
    assert mine.std().item() > 1e-2  # a real signal, not two zero tensors
    expected = {"gpt2": "GPT2LMHeadModel", "gpt2-tanh": "GPT2LMHeadModel",
                "moe": "MixtralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "qwen3moe": "Qwen3MoeForCausalLM"}.get(
        name, "LlamaForCausalLM")
    assert type(hf).__name__ == expected
    if name == "gpt2-tanh":  # the exact GELU in its place moves the logits
        assert hf.config.activation_function == "gelu_new"
        exact = AutoModelForCausalLM.from_pretrained(
            exported[name], activation_function="gelu", local_files_only=True).eval()
        with torch.no_grad():
            moved = (exact(tokens).logits - theirs).abs().max().item()
        report(f"HF export gpt2-tanh with the exact GELU: logits move {moved:.1e}")
        assert moved > 5e-4  # five times the parity limit above
    if not name.startswith("gpt2"):  # GPT-2's config has no head_dim or RoPE
        wide = name.startswith(("gqa", "qwen3"))
        assert hf.config.head_dim == (32 if wide else 64 // 4)
        rope = hf.config.rope_parameters
        assert rope["rope_theta"] == {"llama": 500000.0, "qwen2": 1e6, "qwen3": 1e6,
                                      "qwen3moe": 1e6}.get(name, 10000.0)
        assert (rope["rope_type"], rope.get("factor")) == (
            ("llama3", 32.0) if name == "llama" else ("default", None))
    if name == "llama":  # the scaling shows at these 48 positions: transformers without it
        unscaled = AutoConfig.from_pretrained(exported[name], local_files_only=True)
        unscaled.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
        plain = AutoModelForCausalLM.from_pretrained(exported[name], config=unscaled,
                                                     local_files_only=True).eval()
        with torch.no_grad():
            moved = (plain(tokens).logits - theirs).abs().max().item()
        report(f"HF export llama without its RoPE scaling: logits move {moved:.1e}")
        assert moved > 1e-2
        eps = {"moe": 1e-3, "qwen2": 1e-6, "qwen3": 1e-6, "qwen3moe": 1e-6}.get(name, 1e-5)
        assert hf.config.rms_norm_eps == eps
    tokenizer = AutoTokenizer.from_pretrained(exported[name], local_files_only=True)
    run_tokenizer = export.run_tokenizer(checkpoint_io.resolve(sources[name]))
    assert tokenizer(PROMPTS[2]).input_ids == run_tokenizer.encode(PROMPTS[2]).ids


def test_tp2pp2_validation_loss(runs, exported, data_cache):
    """Independent of our one-process loader: the 4-rank run's own validation loss at its last
    iteration equals transformers' loss on the same validation batch."""
    from megatron_lgs.arguments import parse_args
    from megatron_lgs.data import eval_micro_batches, fixed_batches
    from pretrain_gpt import datasets_provider

    save = runs["gqa-tp2pp2"]
    valid = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    recorded = [r["loss"] for r in valid if r["event"] == "valid" and r["iteration"] == 3][0]
    cfg = parse_args([*TINY_GPT, "--data-cache-dir", data_cache, *ARCHS["gqa"]], world_size=1)
    datasets = datasets_provider(cfg)
    hf = _hf(exported["gqa-tp2pp2"])
    total, count = 0.0, 0
    for batch in fixed_batches(datasets.valid, eval_micro_batches(1, 8, 4, 0, 1)):
        with torch.no_grad():
            logits = hf(batch["tokens"]).logits
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                                   reduction="none")
        total += (losses * batch["loss_mask"].flatten()).sum().item()
        count += batch["loss_mask"].sum().item()
    assert abs(total / count - recorded) < 1e-5


def test_round_trip_and_training_continues(runs, exported, world, tmp_path, data_cache):
    """to-hf then from-hf (the command lines; the export is the fixture's) gives back every
    tensor exactly, and training from the imported checkpoint has the original run's next-step
    loss."""
    save = runs["llama"]
    imported = tmp_path / "imported"
    proc = _cli("megatron_lgs.convert", "from-hf", exported["llama"], imported)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--finetune" in proc.stdout
    original, record = _ours(save / "iter_0000002")
    back, back_record = _ours(imported)
    # Every model flag comes back but the init scale, which no transformers config carries
    # (and a loaded model does not use).
    assert back_record.model == replace(record.model,
                                        init_method_std=back_record.model.init_method_std)
    mine, theirs = (checkpoint_io.full_state_dict(m) for m in (original, back))
    assert mine.keys() == theirs.keys()
    for key, tensor in mine.items():
        assert torch.equal(tensor, theirs[key]), key
    # Iterations 1-2 consume the batches the original trained on, so iteration 3's loss is the
    # forward loss of the imported weights on the original's third batch.
    resumed = run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *ARCHS["llama"],
                            "--train-iters", "3", "--load", str(imported), "--finetune",
                            "--iterations-to-skip", "1", "2", "--eval-iters", "0"],
                           save_dir=tmp_path / "continued")
    original_losses = run_losses(save)
    assert abs(resumed.losses()[-1] - original_losses[-1]) < 1e-6


def run_losses(save: Path) -> list[float]:
    lines = (save / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["event"] == "train"]


@pytest.mark.parametrize("name", ["gpt2", "gpt2-tanh", "gqa", "moe", "qwen2", "qwen3",
                                  "qwen3moe"])
def test_import_gives_back_every_tensor(name, runs, exported, world, tmp_path):
    imported = import_hf.from_hf(exported[name], tmp_path / "ckpt")
    (original, record), (back, back_record) = _ours(runs[name]), _ours(imported)
    assert back_record.model.num_experts == record.model.num_experts
    assert back_record.model.openai_gelu == (name == "gpt2-tanh")
    mine, theirs = (checkpoint_io.full_state_dict(m) for m in (original, back))
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(t, theirs[k]) for k, t in mine.items())


@pytest.mark.parametrize("name", ["gqa", "moe", "qwen3", "qwen3moe"])
def test_greedy_generation_matches_transformers(name, runs, exported):
    """32 new tokens, 3 prompts: ours with the KV cache == ours without == transformers."""
    ours, record = _ours(runs[name])
    hf = _hf(exported[name])
    tokenizer = AutoTokenizer.from_pretrained(exported[name], local_files_only=True)
    distinct = set()
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        cached = gen.generate(ours, ids, 32, record.vocab_size, tokenizer.eos_token_id)
        uncached = gen.generate(ours, ids, 32, record.vocab_size, tokenizer.eos_token_id,
                                kv_cache=False)
        theirs = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        assert cached == uncached == theirs[0, len(ids):].tolist()
        distinct |= set(cached)
    assert len(distinct) > 10  # the sequences really move through the vocabulary


def test_sampling_is_seeded(runs, world):
    ours, record = _ours(runs["gqa"])
    ids = [5, 6, 7]
    draw = [gen.generate(ours, ids, 16, record.vocab_size, None,
                         gen.Sampling(temperature=1.0, top_k=50, top_p=0.9, seed=s))
            for s in (1, 1, 2)]
    assert draw[0] == draw[1] != draw[2]


def test_generate_command_from_tp2pp2(runs, exported):
    """The command line on the 4-rank checkpoint: stdout is exactly the prompt and the
    continuation transformers' greedy generate produces."""
    hf = _hf(exported["gqa-tp2pp2"])
    tokenizer = AutoTokenizer.from_pretrained(exported["gqa-tp2pp2"], local_files_only=True)
    ids = tokenizer(PROMPTS[0]).input_ids
    theirs = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0].tolist()
    proc = _cli("megatron_lgs.generate", runs["gqa-tp2pp2"], "--prompt", PROMPTS[0],
                "--max-new-tokens", "32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == tokenizer.decode(theirs) + "\n"


def _refused(capsys, module, argv: list[str]) -> str:
    assert module.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_bad_input_one_line_nothing_written(runs, exported, tmp_path, capsys):
    not_ours = tmp_path / "not-ours"
    not_ours.mkdir()
    (not_ours / "weights.pt").write_bytes(b"0")
    out = tmp_path / "out"
    assert "not a megatron-lgs checkpoint" in _refused(
        capsys, convert_cli, ["to-hf", str(not_ours), str(out)])
    assert "not a megatron-lgs checkpoint" in _refused(
        capsys, gen, [str(not_ours), "--prompt", "x", "--max-new-tokens", "2"])
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert f"{a_file} is not a directory" in _refused(
        capsys, convert_cli, ["to-hf", str(runs["gpt2"]), str(a_file / "out")])
    for temperature in ("nan", "inf", "0"):  # checked before the checkpoint is read
        assert "--temperature must be finite and > 0" in _refused(
            capsys, gen, [str(not_ours), "--prompt", "x", "--max-new-tokens", "2",
                          "--temperature", temperature])

    truncated = tmp_path / "truncated"
    shutil.copytree(exported["gpt2"], truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert "safetensors" in _refused(capsys, convert_cli, ["from-hf", str(truncated), str(out)])

    # config.json and the weights disagree: transformers would fill the layers the weights lack
    # with random ones, or drop the ones the config does not name, and say so in a log only.
    layers = json.loads((exported["gpt2"] / "config.json").read_text())["n_layer"]
    for n, said in ((layers + 1, "the config names but the weights lack"),
                    (layers - 1, "the weights hold but the config does not name")):
        disagree = tmp_path / f"layers-{n}"
        shutil.copytree(exported["gpt2"], disagree)
        config = json.loads((disagree / "config.json").read_text())
        (disagree / "config.json").write_text(json.dumps({**config, "n_layer": n}))
        assert said in _refused(capsys, convert_cli, ["from-hf", str(disagree), str(out)])

    unmappable = tmp_path / "neox"
    shutil.copytree(exported["gpt2"], unmappable)
    (unmappable / "config.json").write_text(json.dumps(
        {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}))
    assert "GPTNeoXForCausalLM" in _refused(
        capsys, convert_cli, ["from-hf", str(unmappable), str(out)])

    layer_norm_rope = tmp_path / "rope-layernorm"
    shutil.copytree(runs["gpt2"] / "iter_0000003", layer_norm_rope)
    raw = json.loads((layer_norm_rope / "model.json").read_text())
    raw["model"]["position_embedding_type"] = "rope"
    (layer_norm_rope / "model.json").write_text(json.dumps(raw))
    assert "cannot export" in _refused(capsys, convert_cli,
                                       ["to-hf", str(layer_norm_rope), str(out)])
    assert not out.exists() and not out.with_name("out.partial").exists()
