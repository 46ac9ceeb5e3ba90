"""What the layout planner (`plan_run`) plans: a model from a simulator preset, a launch
config or a Hugging Face config, as the `Run` fields the whole-step model takes, and the
trainer's flag line for a plan of it.

A launch config is parsed by the trainer's own parser, so a plan's flag line is the config's
flags with the planner's layout in place of its own. A Hugging Face model (a folder with a
`config.json`, or that file) goes through the same mapping `python -m megatron_lgs.convert
import-hf` uses (`convert.hf_mapping`): what it cannot import faithfully is a one-line error
here too. Its config has no training length or batch, so both are asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from megatron_lgs.lgs.gpus import get_gpu
from megatron_lgs.lgs.planner import Plan, layout_flags, model_flags
from megatron_lgs.lgs.runcheck import RunError, check_run
from megatron_lgs.lgs.runspec import Run, layout_fields, model_fields
from megatron_lgs.lgs.workload import pipeline_split
from megatron_lgs.run_config import ModelConfig

# What the planner chooses (`planner.layout_flags`): a launch config's own values of these are
# replaced, its other flags (model, optimizer, schedule) kept.
LAYOUT_FLAGS = frozenset((
    "--tensor-model-parallel-size", "--sequence-parallel", "--pipeline-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
    "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--recompute-granularity",
    "--recompute-method", "--recompute-num-layers", "--micro-batch-size",
    "--global-batch-size", "--ddp-bucket-size", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--moe-token-dispatcher-type",
    "--overlap-moe-expert-parallel-comm"))


def _preset(name: str) -> tuple[dict, dict]:
    from megatron_lgs.lgs.simulate import PRESETS

    m, lay = PRESETS[name]
    # The flag line runs the trainer, which pads the vocabulary by its default.
    return ({**model_fields(m), "make_vocab_size_divisible_by":
             ModelConfig.make_vocab_size_divisible_by}, layout_fields(m, lay))


def _config_name(spec: str) -> tuple[str, Path]:
    """(name, folder) of a launch config given as a path to its .sh or as a bare name."""
    from megatron_lgs.launch_configs import CONFIGS_DIR

    path = Path(spec)
    return (path.stem, path.parent) if spec.endswith(".sh") else (spec, CONFIGS_DIR)


# Optimizer options of the trainer the step model does not time; each needs the distributed
# optimizer without Megatron-FSDP (a ZeRO-1 row), and several instances replace --lgs. A config
# that sets one is refused: planned as if it did not, its flag line could fail the trainer.
UNMODELLED_OPTIMIZER = {
    "optimizer_cpu_offload": ("--optimizer-cpu-offload",
                              "the optimizer's step on the host and its PCIe copies", ""),
    "reduce_scatter_with_fp32_accumulation": (
        "--reduce-scatter-with-fp32-accumulation",
        "the all-to-all and local FP32 sum that replace the reduce-scatter", ""),
    "num_distributed_optimizer_instances": (
        "--num-distributed-optimizer-instances",
        "megatron-core's two-level gradient reduction", " without its --lgs flags"),
}


def _check_modelled(cfg, spec: str) -> None:
    """A one-line error for a config that sets an option of `UNMODELLED_OPTIMIZER`."""
    defaults = type(cfg.optim)()
    for field, (flag, what, lgs) in UNMODELLED_OPTIMIZER.items():
        if getattr(cfg.optim, field) != getattr(defaults, field):
            raise ValueError(f"{spec} sets {flag}: the step model does not time {what}; plan "
                             f"without it, then add it to a ZeRO-1 row's flags{lgs}")


def _launch_config(spec: str, gpus: int) -> tuple[dict, dict]:
    """A launch config's fields: one of launch/configs/ at its own world size, any other
    (a user's own .sh) at the GPU count asked for."""
    from megatron_lgs.arguments import parse_args
    from megatron_lgs.launch_configs import CONFIGS_DIR, config_args, config_names, world_size
    from megatron_lgs.lgs.simulate import PRESETS

    name, cdir = _config_name(spec)
    if not (cdir / f"{name}.sh").is_file():
        if spec.endswith(".sh"):
            raise ValueError(f"no launch config file {spec}")
        raise ValueError(f"unknown model {spec!r}: simulator presets {sorted(PRESETS)}, launch "
                         f"configs {config_names(cdir)}, the path of a .sh, or a Hugging Face "
                         "model's folder or config.json")
    argv = config_args(name, cdir)
    world = world_size(name) if cdir.resolve() == CONFIGS_DIR.resolve() else gpus
    cfg = parse_args(argv, world_size=world, prog=f"plan_run: launch config {spec}")
    _check_modelled(cfg, spec)
    return trainer_run_fields(cfg, world)


# The trainer's --fp8-recipe -> the model's: Megatron-LM's `tensorwise` is Transformer
# Engine's per-tensor current scaling. `mxfp8` needs Blackwell, `blockwise` is not modelled.
FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current"}


def _fp8_recipe(recipe: str) -> str:
    try:
        return FP8_RECIPES[recipe]
    except KeyError:
        raise ValueError(f"--fp8-recipe {recipe}: the step model knows {sorted(FP8_RECIPES)}") \
            from None


def trainer_run_fields(cfg, num_gpus: int) -> tuple[dict, dict]:
    """(model fields, layout fields) of a `Run` for the trainer's parsed config `cfg`
    (`megatron_lgs.run_config.Config`) on `num_gpus` GPUs, in the config's precision (an FP32
    config as BF16, what GPUs train in). The GPUs are taken to run Transformer Engine, so RoPE
    is fused unless the config says --no-rope-fusion (`megatron_lgs.model.rope_fusion`)."""
    m, par, t, o = cfg.model, cfg.parallel, cfg.training, cfg.optim
    pr = cfg.precision
    precision = "fp8" if pr.fp8_format else "fp16" if pr.fp16 else "bf16"
    model = dict(num_layers=m.num_layers, hidden=m.hidden_size, ffn_hidden=m.ffn_size,
                 heads=m.num_attention_heads, kv_heads=m.query_groups, head_dim=m.head_dim,
                 vocab=cfg.data.vocab_size,
                 make_vocab_size_divisible_by=m.make_vocab_size_divisible_by,
                 seq_length=m.seq_length,
                 swiglu=m.swiglu, num_experts=m.num_experts or 0, moe_topk=m.moe_router_topk,
                 moe_ffn_hidden=m.moe_ffn_hidden_size or 0,
                 untie_embeddings=m.untie_embeddings_and_output_weights,
                 position_embedding=m.position_embedding_type, qk_layernorm=m.qk_layernorm,
                 rope_fusion=m.apply_rope_fusion,
                 # The trainer fuses a GELU's bias add only for the tanh form
                 # (`megatron_lgs.model.mlp_activation`).
                 bias_gelu_fusion=m.swiglu or m.openai_gelu or not m.add_bias_linear,
                 dropout=max(m.hidden_dropout, m.attention_dropout), precision=precision)
    if precision == "fp8":  # BF16 weights: the trainer has no FP8 parameters
        model.update(fp8_recipe=_fp8_recipe(pr.fp8_recipe), fp8_params=False,
                     tp_only_amax_red=pr.tp_only_amax_red)
    zero = {"optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(
        o.data_parallel_sharding_strategy, 1) if o.use_megatron_fsdp else \
        int(o.use_distributed_optimizer)
    vpp = par.virtual_pipeline_size(m.num_layers) or 1
    layout = dict(num_gpus=num_gpus, tp=par.tensor_model_parallel_size,
                  pp=par.pipeline_model_parallel_size, cp=par.context_parallel_size,
                  ep=par.expert_model_parallel_size,
                  etp=par.expert_tp,
                  vpp=vpp, micro_batch=t.micro_batch_size, global_batch=t.global_batch_size,
                  sequence_parallel=par.sequence_parallel,
                  recompute=m.recompute_granularity or "none", zero=zero,
                  recompute_num_layers=(m.recompute_num_layers or 0
                                        if m.recompute_method == "block" else 0),
                  distributed_optimizer=zero >= 1, ddp_bucket_size=o.ddp_bucket_size or 0,
                  # What the trainer's DDP (`optim.wrap_ddp`: LGS needs the hooks) and
                  # Megatron-FSDP (megatron_fsdp.py: forced where it shards gradients, and the
                  # weights' gather where it shards them) overlap.
                  overlap_grad_reduce=o.overlap_grad_reduce or cfg.lgs.lgs or zero >= 2,
                  overlap_param_gather=o.overlap_param_gather or zero == 3,
                  moe_a2a_overlap=m.overlap_moe_expert_parallel_comm,
                  moe_dispatcher=m.moe_token_dispatcher_type, **pipeline_split(par))
    return model, layout


def _without_layout(args: list[str]) -> list[str]:
    """A launch config's argv without the flags (and their values) the planner chooses."""
    from megatron_lgs.arguments import build_parser

    takes_value = {o: a.nargs != 0 for a in build_parser()._actions for o in a.option_strings}
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in LAYOUT_FLAGS or name.startswith("--lgs"):
            skip = "=" not in arg and takes_value.get(name, False)
            continue
        out.append(arg)
    return out


def model_args(spec: str, base: Run) -> list[str]:
    """The flags of the model (and, for a launch config, everything but its layout)."""
    from megatron_lgs.lgs.simulate import PRESETS

    if (folder := hf_folder(spec)) is not None:
        return [*_hf_args(folder, base.seq_length), f"--{base.precision}"]
    if spec in PRESETS and not spec.endswith(".sh"):
        return model_flags(base)
    from megatron_lgs.launch_configs import config_args

    return _without_layout(config_args(*_config_name(spec)))


def best_flags(spec: str, base: Run, p: Plan) -> str:
    """A launch/configs-style argv for plan `p`: the model's flags, then the layout's."""
    return " ".join(model_args(spec, base) + layout_flags(p, base.global_batch))


def hf_folder(spec: str) -> Path | None:
    """The folder of the Hugging Face config `spec` names (a folder holding a config.json, or
    the config.json), None where `spec` is no such thing."""
    path = Path(spec)
    if path.name == "config.json" and path.is_file():
        return path.parent
    return path if (path / "config.json").is_file() else None


def _hf_args(folder: Path, seq_length: int) -> list[str]:
    """The trainer's model flags of a Hugging Face model, trained at `seq_length`."""
    from megatron_lgs.convert.hf_mapping import model_config_from_hf
    from megatron_lgs.convert.import_hf import model_flags as hf_model_flags
    from megatron_lgs.convert.import_hf import read_config

    config = read_config(folder)
    m = model_config_from_hf(config)
    # The config's context length is the longest the model takes, not one it trains at.
    m = replace(m, seq_length=seq_length, max_position_embeddings=m.seq_length)
    return [*hf_model_flags(m), "--vocab-size", str(config.vocab_size)]


def _hf_model(spec: str, folder: Path, seq_length: int) -> dict:
    from megatron_lgs.arguments import parse_args

    cfg = parse_args(_hf_args(folder, seq_length), world_size=1,
                     prog=f"plan_run: Hugging Face config {spec}")
    return trainer_run_fields(cfg, 1)[0]


def resolve(spec: str, gpu: str, gpus: int, global_batch: int | None, nic: float | None,
            gpus_per_node: int = 8, seq_length: int | None = None,
            on_refused: Callable[[str], None] | None = None) -> tuple[Run, Run | None]:
    """(the model on `gpus` GPUs in nodes of `gpus_per_node` in a placeholder layout, the
    config's own layout or None). `seq_length` is a Hugging Face config's training length,
    which it needs, as it needs `global_batch`; a preset or launch config has its own.
    `on_refused` hears why a config's own layout for these GPUs is not a run the model
    takes."""
    from megatron_lgs.lgs.simulate import PRESETS

    folder = hf_folder(spec)
    if folder is None and seq_length is not None:
        raise ValueError(f"--seq-length is for a Hugging Face config; {spec} has its own")
    if folder is not None:
        if seq_length is None or global_batch is None:
            raise ValueError(f"{spec} is a Hugging Face config, which has no training length "
                             "or batch: give --seq-length and --global-batch")
        model, layout = _hf_model(spec, folder, seq_length), None
    elif spec in PRESETS and not spec.endswith(".sh"):
        model, layout = _preset(spec)
    else:
        model, layout = _launch_config(spec, gpus)
    gb = global_batch or layout["global_batch"]
    precision = model.pop("precision", "bf16")
    if gpu == "v100-32gb" and precision == "bf16":
        precision = "fp16"  # Volta has no BF16
    if precision == "fp8" and get_gpu(gpu).fp8_tflops is None:
        raise ValueError(f"{spec} trains in FP8, which {gpu} has no tensor cores for")
    common = dict(model, id=spec, gpu=gpu, nic_gbit_per_gpu=nic, global_batch=gb,
                  gpus_per_node=gpus_per_node, precision=precision,
                  flash_attention=gpu != "v100-32gb")
    base = Run(**common, num_gpus=gpus, tp=1, pp=1, dp=gpus, micro_batch=1)
    ref = None
    if layout and layout["num_gpus"] == gpus:
        ref = Run(**{**common, **{k: v for k, v in layout.items() if k != "global_batch"}})
        ref = replace(ref, dp=gpus // (ref.tp * ref.pp * ref.cp))
        try:
            check_run(ref)
        except RunError as e:  # this global batch, or these nodes, do not take it
            if on_refused:
                on_refused(f"{spec}'s own layout is not predicted on {gpus} GPUs: {e}")
            ref = None
    return base, ref
