"""Options that more than one command takes, defined once so that they mean the same everywhere.

:func:`layout_options` are the layout flags of ``echosim compile`` (``--tp``, ``--pp``, ...,
``--calibration``, ``--pass``); ``explain`` and ``diff`` take the same ones, and
:func:`parse_layout_flags` reads them from a string (``diff --a "--tp 8 --pp 4"``), so a
layout written as flags means the same to every command.

``--calibration`` of ``echosim compile`` and ``echosim cost`` defaults to the database
named by ``$ECHOSIM_CALIBRATION`` (:data:`echosim.calibrate.db.ENV_VAR`): the command
line reads the environment, the library never does, so a Python caller gets exactly the
calibration it passes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

if TYPE_CHECKING:
    from echosim.plan import Cluster, Plan

ENV_VAR = "ECHOSIM_CALIBRATION"  # the same name as echosim.calibrate.db.ENV_VAR, without importing it

F = TypeVar("F", bound=Callable[..., Any])


def _splash_blocks(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """``--splash-blocks 2048,2048,2048,2048,2048,2048`` as the six sizes (:attr:`echosim.plan.Plan.splash_blocks`)."""
    if value is None:
        return None
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not six comma-separated integers") from None


def _environment_names_a_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A value taken from ``$ECHOSIM_CALIBRATION`` names a database file: a missing one is one line."""
    from_environment = ctx.get_parameter_source(param.name or "") is ParameterSource.ENVIRONMENT
    if value and from_environment and not Path(value).exists():
        raise click.ClickException(f"{ENV_VAR}={value}: no such file (`echosim calibrate` creates it)")
    return value


def calibration_option(help: str, **kwargs: Any) -> Callable[[F], F]:
    """``--calibration`` with ``$ECHOSIM_CALIBRATION`` as its default, shown in ``--help``."""
    return click.option(
        "--calibration",
        envvar=ENV_VAR,
        show_envvar=True,
        callback=_environment_names_a_file,
        help=help,
        **kwargs,
    )


FRAMEWORK_HELP = (
    "Training framework whose defaults fill what is not given and whose memory behaviour applies: "
    "megatron, megatron-2022 (before FlashAttention), megatron-ce-native and megatron-ce-te "
    "(--cross-entropy-loss-fusion, --cross-entropy-fusion-impl native / te), megascale (Megatron-LM with its TP "
    "collectives overlapped, as MegaScale's paper describes), nemo, nemo-ce-native (NeMo 2.0: "
    "the fused 'native' loss), megatron-bridge (Transformer Engine's fused loss), torchtitan, torchtitan-compile, "
    "torchtitan-2025, "
    "torchtitan-2025-compile (per-block torch.compile, eager loss: before bbb1b61), torchtitan-2025-compile-loss "
    "(the loss compiled too), maxtext, maxtext-bf16-weights (weight_dtype: bfloat16), maxtext-splash-fused, "
    "maxtext-bf16-weights-splash-fused (sa_use_fused_bwd_kernel: True), maxtext-te (attention=cudnn_flash_te), "
    "deepspeed, "
    "deepspeed-2021 (ZeRO-3 as DeepSpeed 0.3.14 ran it), hai-llm (DeepSeek-V3's FP8 framework: FP8 SwiGLU "
    "inputs, a 12-bit attention output), composer, composer-fa1 (llm-foundry's flash attention on "
    "flash-attn 1.x), composer-triton (llm-foundry's Triton attention), composer-triton-pure (the same with FSDP "
    "mixed_precision 'PURE'), jax-xla (JAX compiled by XLA, no framework defaults), nemo-megatron-vit (NeMo 1.x's "
    "Megatron ViT), apex-ddp (plain PyTorch under apex's DistributedDataParallel), eager (plain PyTorch under "
    "torch DDP, the default) or eager-amp (plain PyTorch under torch.autocast over fp32 parameters)."
)
framework_option = click.option("--framework", help=FRAMEWORK_HELP)


def layout_options(fn: F) -> F:
    """The layout flags of ``echosim compile``; the decorated command receives them as keyword arguments."""
    options = [
        click.option("--backend", help="Hardware backend (see `echosim backends`)."),
        click.option("--devices", type=int, help="Number of devices (default: tp*pp*dp)."),
        click.option(
            "--devices-per-node",
            type=int,
            help="Devices per node: NVLink domain, NVL72 rack or TPU slice [default: the backend's for this job].",
        ),
        click.option("--tp", type=int, help="Tensor-parallel degree."),
        click.option("--pp", type=int, help="Pipeline-parallel degree."),
        click.option("--dp", type=int, help="Data-parallel degree."),
        click.option("--micro-batch", type=int, help="Sequences per micro-batch."),
        click.option("--global-batch", type=int, help="Sequences per optimizer step."),
        click.option("--seq-len", type=int, help="Tokens per sequence (default: the model's)."),
        click.option(
            "--dtype",
            type=click.Choice(["fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4", "int8"]),
            help="Training precision (mixed, fp32 master); int8: integer GEMMs (MaxText AQT, TPUs).",
        ),
        click.option(
            "--recompute",
            help="Activation checkpointing policy: none, selective, full, full:N (the first N layers of each "
            "pipeline stage: Megatron's --recompute-method block), full:every-N (every N-th layer: torchtitan's "
            "layer-wise AC), full:uniform-N (one checkpoint per N layers, replayed together: Megatron's "
            "--recompute-method uniform), selective:MODULE,... (Megatron's "
            "recompute modules: core_attn, layernorm, moe_act, mla_up_proj, mlp, moe, shared_experts); MaxText's "
            "remat policies "
            "(minimal, save_qkv_proj, qkv_proj_offloaded, ..., custom:TENSOR=device|offload|remat,...); "
            "op (torchtitan per-op SAC).",
        ),
        click.option(
            "--cp-comm",
            type=click.Choice(["p2p", "all_gather", "a2a", "a2a+p2p"]),
            help="Context parallel: ring (p2p), all-gathered K/V, a2a (attention head-parallel, Ulysses), or "
            "a2a+p2p (hierarchical: a2a inside groups of --cp-a2a ranks, the ring across them).",
        ),
        click.option(
            "--cp-a2a",
            type=int,
            help="--cp-comm a2a+p2p: ranks per all-to-all group, neighbours in the CP group (Megatron's "
            "--hierarchical-context-parallel-sizes A P gives A; cp / A ranks form the ring) [default: the largest "
            "proper divisor of cp whose groups stay inside a node].",
        ),
        click.option(
            "--fsdp-reduce-dtype",
            type=click.Choice(["fp32", "bf16", "fp16"]),
            help="ZeRO-3 / FSDP's gradient reduce-scatter dtype (PyTorch FSDP2's reduce_dtype, Megatron-FSDP's "
            "--megatron-fsdp-grad-comm-dtype); default: the framework's.",
        ),
        click.option(
            "--grad-dtype",
            type=click.Choice(["fp32", "bf16", "fp16"]),
            help="The gradient buffer's dtype over 16-bit weights with an fp32 master: fp32 (Megatron's "
            "--accumulate-allreduce-grads-in-fp32) or the weights' own (--grad-reduce-in-bf16); ZeRO 0-2 reduce "
            "the gradients in it; default: the framework's.",
        ),
        click.option(
            "--cp-balance/--no-cp-balance", default=None, help="Causal load balancing of context parallelism."
        ),
        click.option("--moe-capacity-factor", type=float, help="Expert capacity over the fair share (0: dropless)."),
        click.option(
            "--moe-imbalance", type=float, help="Busiest expert-parallel rank's load over the mean (1: balanced)."
        ),
        click.option(
            "--moe-dispatcher",
            type=click.Choice(["alltoall", "deepep", "hybridep"]),
            help="Expert dispatch: NCCL's all_to_all, DeepEP's (across nodes a token crosses the network "
            "once per destination node, then NVLink), or HybridEP's (the same path; it pads the experts' rows for "
            "fp8 itself).",
        ),
        click.option(
            "--moe-router-groups",
            type=int,
            help="Group-limited routing: the routed experts form this many equal groups (DeepSeek-V3: 8).",
        ),
        click.option(
            "--moe-router-group-topk",
            type=int,
            help="Group-limited routing: a token's experts come from this many of the groups (DeepSeek-V3: 4).",
        ),
        click.option(
            "--embedding-sharding",
            help="Embedding tables over the data-parallel ranks, as TorchRec shards them: "
            "none, table, row, column, data, table_row (a node's ranks hold a table's rows), auto (per table, "
            "TorchRec's planner rule).",
        ),
        click.option("--schedule", help="Pipeline schedule: 1f1b, gpipe, interleaved, zb-h1, dualpipe, or a plugin's."),
        click.option("--attention", type=click.Choice(["flash", "math"]), help="Fused or materialised attention."),
        click.option(
            "--pp-balance",
            help="How layers are split into stages: uniform, cost, or layout:STRING, a Megatron-Core "
            "pipeline layout ('Et|(tt|)*30mL': | ends a stage; E embedding, t layer, m MTP, L loss).",
        ),
        click.option("--sp/--no-sp", default=None, help="Megatron sequence parallelism."),
        click.option("--cp", type=int, help="Context-parallel degree."),
        click.option("--ep", type=int, help="Expert-parallel degree (within cp x dp; tp x cp x dp with --etp 1)."),
        click.option(
            "--moe-ep-overlap/--no-moe-ep-overlap",
            default=None,
            help="Overlap one micro-batch's EP all-to-alls with the adjacent micro-batch's compute (Megatron "
            "--overlap-moe-expert-parallel-comm, combined 1F1B).",
        ),
        click.option(
            "--moe-fused-mlp/--no-moe-fused-mlp",
            default=None,
            help="Transformer Engine's fused grouped expert MLP (CuTe DSL, NVTE_CUTEDSL_FUSED_GROUPED_MLP): the GLU "
            "and its quantisation run in the grouped GEMMs' epilogues (Blackwell, --dtype mxfp8 or nvfp4).",
        ),
        click.option(
            "--fp8-attention/--no-fp8-attention",
            default=None,
            help="Run the fused attention in FP8 (Transformer Engine's fp8_dot_product_attention, needs an FP8 "
            "--dtype): its BF16 time over cuDNN's measured FP8 speed-up, on B200, GB200, B300 and GB300.",
        ),
        click.option(
            "--etp",
            type=int,
            help="Tensor-parallel degree of the routed experts: tp (default) or 1 (experts whole; expert "
            "parallelism folds over tp x cp x dp, Megatron --expert-tensor-parallel-size).",
        ),
        click.option("--zero", type=click.IntRange(0, 3), help="ZeRO stage (3 = FSDP)."),
        click.option("--vpp", type=int, help="Virtual pipeline stages per rank (interleaved 1F1B)."),
        click.option("--tp-overlap/--no-tp-overlap", default=None, help="Overlap TP collectives with chunked GEMMs."),
        click.option(
            "--offload-layers",
            type=click.IntRange(0),
            help="Layers per stage whose activations are offloaded to host memory (Megatron-Core "
            "--cpu-offloading-num-layers).",
        ),
        click.option(
            "--offload-optimizer/--no-offload-optimizer",
            default=None,
            help="Keep the optimizer's fp32 master weights and moments in host memory and step them on the host CPU "
            "(DeepSpeed's offload_optimizer, Megatron-Core's --optimizer-cpu-offload; needs --zero 1 or higher): "
            "gradients down and weights back over the GPU's host link, the step at the host's memory bandwidth.",
        ),
        click.option(
            "--offload-overlap/--no-offload-overlap",
            default=None,
            help="Pipeline the offloaded optimizer's copies and host step over parameter groups, so it takes the "
            "slowest of the three (Megatron-Core's --overlap-cpu-optimizer-d2h-h2d; needs --offload-optimizer).",
        ),
        click.option(
            "--offload-params/--no-offload-params",
            default=None,
            help="Keep ZeRO-3's weight shards in host memory (DeepSpeed's offload_param; needs --zero 3): each "
            "all-gather first copies the rank's shard over the GPU's host link.",
        ),
        click.option(
            "--optimizer-dtypes",
            help="The optimizer's states in these dtypes, KEY=DTYPE,... over main_grads=fp32|bf16, "
            "main_params=fp32|fp16, exp_avg=fp32|fp16|bf16|fp8, exp_avg_sq=fp32|fp16|bf16|fp8 (the others fp32): "
            "Megatron's --use-precision-aware-optimizer, under whose frameworks Transformer Engine keeps only the "
            "16 bits of each fp32 master that bf16 weights lack.",
        ),
        click.option(
            "--loss-chunks",
            type=int,
            help="Run the output layer and loss over this many token chunks, recomputing each chunk's "
            "logits in backward (MaxText num_vocab_tiling).",
        ),
        click.option(
            "--splash-blocks",
            callback=_splash_blocks,
            help="TPU splash attention's blocks, six sizes Q,KV,Q_DKV,KV_DKV,Q_DQ,KV_DQ (MaxText sa_block_q, "
            "sa_block_kv, sa_block_q_dkv, sa_block_kv_dkv, sa_block_q_dq, sa_block_kv_dq; default 512 each).",
        ),
        framework_option,
        calibration_option(help="Use a calibration from `echosim calibrate` (NAME, FILE or FILE#NAME)."),
        click.option("--pass", "passes", multiple=True, help="Run an optional plugin pass by name (repeatable)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def layout_from_options(model: str | None, opts: dict[str, Any], calibration_typed: bool) -> tuple[str, Plan, Cluster]:
    """The model, plan and cluster that ``compile``'s layout flags describe.

    A calibration typed on the command line (not taken from ``$ECHOSIM_CALIBRATION``) also
    picks the backend it was made for, unless ``--backend`` is given.
    """
    from echosim.plan import plan_from_options

    opts = dict(opts)
    if calibration_typed and opts.get("calibration") and not opts.get("backend"):
        from echosim.calibrate import load_calibration

        backends = load_calibration(opts["calibration"]).backends
        opts["backend"] = backends[0] if len(backends) == 1 else None
    opts["passes"] = tuple(opts.get("passes") or ()) or None
    return plan_from_options(model, opts)


@click.command("layout", add_help_option=False)
@layout_options
def _layout_parser(**opts: Any) -> None:
    """Parses a layout written as compile flags (never run as a command)."""


def parse_layout_flags(model: str | None, text: str, option: str) -> tuple[str, Plan, Cluster]:
    """A layout written as ``compile`` flags in one string (``"--tp 8 --pp 4"``); bad flags are one line."""
    from echosim.errors import EchosimError

    try:
        import shlex  # only for --from-args

        args = shlex.split(text)
        ctx = _layout_parser.make_context("layout", args, resilient_parsing=False)
    except (ValueError, click.UsageError) as exc:
        message = exc.format_message() if isinstance(exc, click.UsageError) else str(exc)
        raise EchosimError(f"{option} {text!r}: {message}") from None
    typed = any(a == "--calibration" or a.startswith("--calibration=") for a in args)
    return layout_from_options(model, ctx.params, typed)


def from_options(fn: F) -> F:
    """``--from FRAMEWORK:FILE``, ``--from-args`` and ``--verbose`` of ``echosim compile``."""
    options = [
        click.option(
            "--from",
            "from_source",
            metavar="FRAMEWORK:FILE",
            help="Read the layout (and the model, where it gives sizes) from a framework's own config: "
            "megatron:train.sh (a launch script or a file of arguments), nemo:run.yaml, "
            "mbridge:run_config.yaml (a Megatron-Bridge ConfigContainer), torchtitan:job.toml, "
            "maxtext:base.yml,model.yml[,key=value ...], deepspeed:ds_config.json (with MODEL). "
            "Flags given beside it override it. See docs/configs.md.",
        ),
        click.option("--from-args", metavar="ARGS", help='Megatron-LM arguments in one string: "--num-layers 32 ...".'),
        click.option("--verbose", is_flag=True, help="With --from: also list the keys that were ignored."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def layout_from_config(
    model: str | None, source: str | None, args: str | None, opts: dict[str, Any], calibration_typed: bool,
    verbose: bool,
) -> tuple[Any, Plan, Cluster]:  # fmt: skip
    """The model, plan and cluster a framework config describes, flags beside it overriding.

    Prints (to stderr, so that ``--json`` stays one document) the layout as it was understood,
    written as the flags that reproduce it, the notes, the keys not understood and, with
    ``verbose``, the keys ignored.
    """
    from echosim.configs import describe_model, read_args, read_source, resolve
    from echosim.errors import EchosimError
    from echosim.plan import plan_flags

    if source and args:
        raise EchosimError("--from and --from-args: give one")
    cfg = read_source(source) if source else read_args(args or "")
    chosen, merged = resolve(cfg, opts, model)
    name, plan, cluster = layout_from_options(chosen, merged, calibration_typed)
    flags = " ".join(plan_flags(plan, cluster))
    click.echo(f"{cfg.source}: {describe_model(name)} {flags}".rstrip(), err=True)
    for note in cfg.notes:
        click.echo(f"  note: {note}", err=True)
    if cfg.unknown:
        click.echo(f"  not understood (not simulated): {', '.join(cfg.unknown)}", err=True)
    if verbose and cfg.ignored:
        click.echo(f"  ignored (no effect on step time or memory): {', '.join(cfg.ignored)}", err=True)
    return name, plan, cluster
