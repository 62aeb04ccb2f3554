"""Megatron-LM arguments (a launch script, a file of arguments, or a string) as a plan and a model.

Names and defaults are Megatron-LM's ``megatron/training/arguments.py`` (commit d98e8a6,
core_r0.x); what a script leaves out takes those defaults, and the framework's own
(:mod:`echosim.frameworks`, ``megatron``) fill the rest. The model is built from the
script's sizes (``--num-layers``, ``--hidden-size``, ...) and named after the zoo entry it
equals, if any.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

from echosim.configs.base import ConfigError, FromConfig, as_float, as_int, model_or_zoo, read_text
from echosim.configs.shell import launch_command
from echosim.frameworks import loss_framework, weights_16bit_dtype
from echosim.frontend.zoo import ArchConfig
from echosim.passes.memory import OPTIMIZER_DTYPES, given_dtypes
from echosim.passes.pipeline import LayoutError, layout_counts
from echosim.passes.recompute import MEGATRON_MODULES

ARGS = "Megatron-LM megatron/training/arguments.py, commit d98e8a6"
TOKENIZER = "Megatron-LM megatron/training/tokenizer/tokenizer.py, commit d98e8a6"

#: Vocabulary sizes of the tokenizers Megatron builds from files echosim does not have.
TOKENIZER_VOCAB = {
    "GPT2BPETokenizer": 50257,  # GPT-2 BPE (gpt2-vocab.json), Radford et al. 2019
    "Llama2Tokenizer": 32000,  # Llama 2 SentencePiece model (Touvron et al. 2023)
}

#: Flags that change neither step time nor memory: data, paths, logging, seeds, learning-rate schedule.
IGNORED_PREFIXES = (
    "--lr",
    "--min-lr",
    "--decoupled-lr",
    "--decoupled-min-lr",
    "--log-",
    "--save",
    "--load",
    "--eval-",
    "--tensorboard",
    "--wandb-",
    "--data-",
    "--split",
    "--vocab-file",
    "--merge-file",
    "--tokenizer-model",
    "--tiktoken-",
    "--seed",
    "--train-iters",
    "--train-samples",
    "--exit-",
    "--profile",
    "--use-mcore-models",
    "--ckpt-",
    "--no-load-",
    "--no-save-",
    "--distributed-timeout-minutes",
    "--mock-data",
    "--num-workers",
    "--weight-decay",
    "--adam-",
    "--clip-grad",
    "--init-method-std",
    "--no-mmap-bin-files",
    "--no-create-attention-mask-in-dataloader",
    "--timing-log-",
    "--use-checkpoint-",
    "--dist-ckpt-",
    "--finetune",
    "--manual-gc",
    "--rotary-base",
    "--rotary-percent",
    "--rope-scaling",
    "--norm-epsilon",
    "--layernorm-epsilon",
    "--moe-aux-loss-coeff",
    "--moe-z-loss-coeff",
    "--moe-router-load-balancing-type",
    "--calculate-per-token-loss",
    "--ffn-hidden-size-",
    # routing arithmetic on the [tokens x experts] scores and YaRN's rotary scaling: no measurable step time
    "--moe-router-pre-softmax",
    "--moe-router-topk-scaling-factor",
    "--moe-router-score-function",
    "--moe-router-enable-expert-bias",
    "--moe-router-bias-update-rate",
    "--rotary-scaling-factor",
    "--mscale",
    "--no-check-for-nan-in-loss-and-grad",
    "--mtp-loss-scaling-factor",
    "--init-model-with-meta-device",
    "--auto-detect-ckpt-format",
    "--logging-level",
)

#: Flags echosim understands but does not model: the effect each has is named in the note.
NOT_MODELLED = {
    "--overlap-param-gather": "the parameter all-gather overlap of the distributed optimizer",
    "--fp8-param-gather": "fp8 parameter all-gather",
    "--moe-permute-fusion": "Transformer Engine's fused permute and unpermute, costed as echosim's dispatch and "
    "combine ops",
    "--moe-router-fusion": "Transformer Engine's fused router kernels, costed as echosim's router ops",
    "--moe-router-padding-for-quantization": "the router's padding of expert rows for FP8; padding copies are costed "
    "where the dispatcher does not align the rows",
    "--no-masked-softmax-fusion": "the unfused masked softmax",
    "--apply-layernorm-1p": "zero-centred LayerNorm weights",
    "--empty-unused-memory-level": "emptying the CUDA cache",
    "--rampup-batch-size": "the batch-size ramp of the first steps (the full batch is simulated)",
    "--fp8-amax-history-len": "fp8 scaling history",
    "--fp8-amax-compute-algo": "fp8 scaling",
    "--moe-router-dtype": "the router's dtype",
    "--attention-softmax-in-fp32": "softmax in fp32",
    "--transformer-impl": "the transformer implementation (Transformer Engine or local)",
    "--cuda-graph-impl": "CUDA graphs; echosim prices the GPU's work, not the host's launches",
    "--cuda-graph-scope": "CUDA graphs; echosim prices the GPU's work, not the host's launches",
    "--moe-hybridep-num-sms": "the SMs HybridEP's kernels take from compute",
    "--reuse-grad-buf-for-mxfp8-param-ag": "reusing the gradient buffer for the MXFP8 parameter all-gather",
    "--te-rng-tracker": "Transformer Engine's RNG tracker",
    "--no-gradient-accumulation-fusion": "weight gradients accumulated by a separate add",
    "--fsdp-double-buffer": "Megatron-FSDP's persistent double buffers",
    "--use-nccl-ub": "NCCL user buffers",
    "--use-torch-optimizer-for-cpu-offload": "the host optimizer's implementation (costed at host memory bandwidth)",
}

#: Megatron-FSDP's ``--data-parallel-sharding-strategy`` (default optim_grads_params, arguments.py at d98e8a6) as
#: the ZeRO stage that shards the same state.
FSDP_SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}

#: Flags the reader consumes (their value is read into the plan or the model).
CONSUMED = {
    "--megatron-fsdp-grad-comm-dtype",
    "--megatron-fsdp-main-grads-dtype",
    "--grad-reduce-in-bf16",
    "--accumulate-allreduce-grads-in-fp32",
    "--use-precision-aware-optimizer",
    "--main-grads-dtype",
    "--main-params-dtype",
    "--exp-avg-dtype",
    "--exp-avg-sq-dtype",
    "--cross-entropy-loss-fusion",
    "--cross-entropy-fusion-impl",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--overlap-moe-expert-parallel-comm",
    "--virtual-pipeline-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--optimizer-cpu-offload",
    "--optimizer-offload-fraction",
    "--overlap-cpu-optimizer-d2h-h2d",
    "--micro-batch-size",
    "--global-batch-size",
    "--seq-length",
    "--max-position-embeddings",
    "--fp16",
    "--bf16",
    "--fp8-format",
    "--fp8",
    "--recompute-granularity",
    "--recompute-activations",
    "--tp-comm-overlap",
    "--cp-comm-type",
    "--hierarchical-context-parallel-sizes",
    "--moe-expert-capacity-factor",
    "--moe-pad-expert-input-to-capacity",
    "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend",
    "--moe-enable-deepep",
    "--moe-router-num-groups",
    "--moe-router-group-topk",
    "--attention-backend",
    "--num-layers",
    "--hidden-size",
    "--num-attention-heads",
    "--ffn-hidden-size",
    "--kv-channels",
    "--group-query-attention",
    "--num-query-groups",
    "--swiglu",
    "--num-experts",
    "--moe-router-topk",
    "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size",
    "--vocab-size",
    "--tokenizer-type",
    "--make-vocab-size-divisible-by",
    "--untie-embeddings-and-output-weights",
    "--normalization",
    "--position-embedding-type",
    "--no-position-embedding",
    "--hidden-dropout",
    "--attention-dropout",
    "--overlap-grad-reduce",
    "--use-flash-attn",
    "--recompute-method",
    "--recompute-num-layers",
    "--disable-bias-linear",
    "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout",
    "--recompute-modules",
    "--fp8-recipe",
    "--moe-grouped-gemm",
    "--moe-layer-freq",
    "--moe-router-force-load-balancing",
    "--mtp-num-layers",
    "--multi-latent-attention",
    "--q-lora-rank",
    "--kv-lora-rank",
    "--qk-head-dim",
    "--qk-pos-emb-head-dim",
    "--v-head-dim",
    "--qk-layernorm",
    "--use-megatron-fsdp",
    "--use-torch-fsdp2",
    "--data-parallel-sharding-strategy",
}

#: Megatron-Core's ``recompute_modules`` (TransformerConfig.__post_init__ at commit d98e8a6); echosim models
#: :data:`echosim.passes.recompute.MEGATRON_MODULES` of them.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                     "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")  # fmt: skip
#: TransformerConfig.fp8_recipe's choices (default 'delayed', commit d98e8a6).
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")


def parse_flags(args: list[str]) -> list[tuple[str, list[str]]]:
    """``--flag v1 v2 --other`` -> ``[("--flag", ["v1", "v2"]), ("--other", [])]`` (``--flag=v`` too)."""
    out: list[tuple[str, list[str]]] = []
    for word in args:
        if word.startswith("--"):
            flag, eq, value = word.partition("=")
            out.append((flag, [value] if eq else []))
        elif out:
            out[-1][1].append(word)
        else:
            raise ConfigError(f"argument {word!r} before any --flag")
    return out


def read_megatron(spec: str, source: str) -> FromConfig:
    """``megatron:train.sh`` (a launch script or a file of arguments)."""
    text = read_text(spec, source)
    launch = launch_command(text, spec)
    launcher: list[str] = []
    if launch is None or not any(a.startswith("--") for a in launch.args):
        words = _argument_file(text)
        if words is None:
            raise ConfigError(
                f"{source}: not a Megatron launch script: no command runs a .py program with --arguments "
                "(and the file is not a list of --arguments)"
            )
        args = words
    else:
        launcher, args = launch.launcher, launch.args
    return from_arguments(args, source, launcher)


def read_megatron_args(text: str) -> FromConfig:
    """``--from-args "--tensor-model-parallel-size 8 ..."``."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError as exc:
        raise ConfigError(f"--from-args: cannot split {text!r} ({exc})") from None
    return from_arguments(words, "--from-args", [])


def _argument_file(text: str) -> list[str] | None:
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError:
        return None
    if words and words[0].startswith("--") and not any(w.endswith(".py") for w in words):
        return words
    return None


def from_arguments(args: list[str], source: str, launcher: list[str]) -> FromConfig:
    try:
        flags = parse_flags(args)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if not any(f == "--num-layers" for f, _ in flags) and not any(f.endswith("parallel-size") for f, _ in flags):
        raise ConfigError(
            f"{source}: not a Megatron launch line: none of --num-layers, --tensor-model-parallel-size, "
            "--pipeline-model-parallel-size is given"
        )
    values: dict[str, list[str]] = {}
    out = FromConfig(source, "megatron")
    for flag, vals in flags:
        values[flag] = vals  # argparse: the last occurrence wins
    for flag in values:
        if flag in CONSUMED:
            continue
        if flag.startswith(IGNORED_PREFIXES):
            out.ignored.append(flag)
        elif flag in NOT_MODELLED:
            out.notes.append(f"{flag}: not modelled ({NOT_MODELLED[flag]})")
        else:
            out.unknown.append(flag)
    out.framework = out.options["framework"] = loss_framework("megatron", _loss_kernel(values, source))
    _plan(values, out)
    _devices(launcher, out)
    try:
        out.model = _model(values, out, source)
    except ConfigError as exc:  # needed only when no MODEL is named beside the file
        out.model_error = str(exc)
    return out


def _loss_kernel(values: dict[str, list[str]], source: str) -> str:
    """The cross-entropy kernels the flags select: Megatron-Core's unfused loss unless --cross-entropy-loss-fusion,
    then --cross-entropy-fusion-impl (default 'native'; Megatron-LM megatron/training/arguments.py, commit d98e8a6)."""
    if "--cross-entropy-loss-fusion" not in values:
        return "unfused"
    impl = _one(values, "--cross-entropy-fusion-impl", source) or "native"
    if impl not in ("native", "te"):
        raise ConfigError(f"{source}: --cross-entropy-fusion-impl {impl!r} (native or te)")
    return impl


def _one(values: dict[str, list[str]], flag: str, source: str) -> str | None:
    if flag not in values:
        return None
    vals = values[flag]
    if len(vals) != 1:
        raise ConfigError(f"{source}: {flag} takes one value, got {len(vals)} ({' '.join(vals) or 'none'})")
    return vals[0]


def _cp_comm_type(values: dict[str, list[str]], source: str) -> str | None:
    """``--cp-comm-type``: one scheme, or one per layer (Megatron-Core's ``cp_comm_type`` list, nargs '+'), which
    echosim reads where every layer names the same scheme; a mix is refused (every layer runs one scheme here)."""
    schemes = values.get("--cp-comm-type")
    if schemes is None:
        return None
    if len(set(schemes)) > 1:
        raise ConfigError(
            f"{source}: --cp-comm-type {' '.join(schemes)}: a scheme per layer is not modelled (one for every layer is)"
        )
    return schemes[0] if schemes else _one(values, "--cp-comm-type", source)  # none: _one names the missing value


def _hierarchical_cp(values: dict[str, list[str]], comm: str | None, out: FromConfig) -> None:
    """``--hierarchical-context-parallel-sizes A P``: the a2a+p2p groups, A ranks each. Megatron-LM asserts that the
    sizes multiply to the CP degree and that a2a+p2p has them (megatron/training/arguments.py, commit d98e8a6);
    Transformer Engine runs two levels (``AttnFuncWithCPAndKVP2P``), so a third size is refused. Under another
    --cp-comm-type they size nothing (a note)."""
    flag = "--hierarchical-context-parallel-sizes"
    sizes = values.get(flag)
    if sizes is None:
        if comm == "a2a+p2p":
            raise ConfigError(f"{out.source}: --cp-comm-type a2a+p2p needs {flag} (Megatron-LM asserts it)")
        return
    if comm != "a2a+p2p":
        out.notes.append(f"{flag}: read only with --cp-comm-type a2a+p2p; ignored")
        return
    if len(sizes) != 2:
        raise ConfigError(
            f"{out.source}: {flag} {' '.join(sizes) or '(none)'}: Transformer Engine's a2a+p2p takes two sizes (A P)"
        )
    a2a, ring = (as_int(v, flag, out.source) for v in sizes)
    cp = out.options.get("cp", 1)
    if a2a * ring != cp:
        raise ConfigError(f"{out.source}: {flag} {a2a} {ring} multiply to {a2a * ring}, not the CP degree {cp}")
    out.options["cp_a2a"] = a2a


def _int(values: dict[str, list[str]], flag: str, source: str, default: int | None = None) -> int | None:
    text = _one(values, flag, source)
    return default if text is None else as_int(text, flag, source)


def _fsdp_grad_comm(values: dict[str, list[str]], out: FromConfig) -> None:
    """Megatron-FSDP's gradient reduce-scatter dtype: ``--megatron-fsdp-grad-comm-dtype``, whose ``auto`` (the
    default) takes ``--megatron-fsdp-main-grads-dtype``, whose ``auto`` takes the model's gradient dtype
    (arguments.py, commit d98e8a6), echosim's reduction in the parameters' dtype. Under ZeRO-3 it is
    ``fsdp_reduce_dtype``; under a lower sharding strategy the reduction is the distributed optimizer's (a note)."""
    src = out.source
    comm = _one(values, "--megatron-fsdp-grad-comm-dtype", src) or "auto"
    main = _one(values, "--megatron-fsdp-main-grads-dtype", src) or "auto"
    for flag, value in (("--megatron-fsdp-grad-comm-dtype", comm), ("--megatron-fsdp-main-grads-dtype", main)):
        if value not in ("fp32", "bf16", "fp16", "auto"):
            raise ConfigError(f"{src}: {flag} {value!r} (Megatron knows fp32, fp16, bf16, auto)")
    chosen = comm if comm != "auto" else main
    if chosen == "auto":
        return
    if out.options.get("zero") == 3:
        out.options["fsdp_reduce_dtype"] = chosen
    else:
        out.notes.append(
            f"--megatron-fsdp-grad-comm-dtype {chosen}: costed as the distributed optimizer's reduction, not ZeRO-3's"
        )


def _grad_dtype(values: dict[str, list[str]], out: FromConfig) -> None:
    """The gradient buffer's dtype as ``grad_dtype`` (arguments.py and training.py, commit d98e8a6).

    Megatron-FSDP keeps it in ``--megatron-fsdp-main-grads-dtype``, whose ``auto`` (the default) is the model's
    gradient dtype: the weights' 16 bits. Megatron-Core's DDP keeps it in fp32 when
    ``accumulate_allreduce_grads_in_fp32`` (``grad_reduce_in_fp32``), else in the weights' dtype: bf16 training
    turns that on unless ``--grad-reduce-in-bf16``; fp16 training leaves it off unless
    ``--accumulate-allreduce-grads-in-fp32``. Nothing is set for fp32 training, for bf16 without either flag, or for
    fp16 without the flag: those are the framework's own defaults (fp32, and fp16: Framework.grads_16bit_under_fp16)."""
    opts, src = out.options, out.source
    dtype = opts.get("dtype", "fp32")
    if dtype == "fp32":
        return
    weights = weights_16bit_dtype(dtype)
    if "--use-megatron-fsdp" in values:
        main = _one(values, "--megatron-fsdp-main-grads-dtype", src) or "auto"
        opts["grad_dtype"] = "fp32" if main == "fp32" else weights  # 16 bits either way
    elif dtype != "fp16" and "--grad-reduce-in-bf16" in values:
        opts["grad_dtype"] = "bf16"
    elif "--accumulate-allreduce-grads-in-fp32" in values:
        if given_dtypes(opts.get("optimizer_dtypes", "")).get("main_grads", "fp32") != "fp32":
            raise ConfigError(f"{src}: --main-grads-dtype bf16 with --accumulate-allreduce-grads-in-fp32 (Megatron "
                              "asserts main gradients are fp32 when they accumulate in fp32)")  # fmt: skip
        opts["grad_dtype"] = "fp32"
    if dtype == "fp16" and "--grad-reduce-in-bf16" in values:
        out.notes.append("--grad-reduce-in-bf16: read by Megatron only with --bf16; ignored")


def _optimizer_dtypes(values: dict[str, list[str]], out: FromConfig) -> None:
    """``--use-precision-aware-optimizer`` and the state dtypes it takes (arguments.py's choices; without it
    Megatron-Core asserts they are fp32: optimizer_config.py, commit d98e8a6) as ``optimizer_dtypes``."""
    src = out.source
    dtypes: dict[str, str] = {}
    for key, choices in OPTIMIZER_DTYPES.items():
        flag = f"--{key.replace('_', '-')}-dtype"
        value = _one(values, flag, src) or choices[0]
        if value not in choices:
            raise ConfigError(f"{src}: {flag} {value!r} (Megatron knows {', '.join(choices)})")
        dtypes[key] = value
    if "--use-precision-aware-optimizer" in values:
        out.options["optimizer_dtypes"] = ",".join(f"{k}={v}" for k, v in dtypes.items())
    elif lowered := [k for k, v in dtypes.items() if v != OPTIMIZER_DTYPES[k][0]]:
        flag = f"--{lowered[0].replace('_', '-')}-dtype"
        raise ConfigError(f"{src}: {flag} {dtypes[lowered[0]]} needs --use-precision-aware-optimizer")


def _offload(values: dict[str, list[str]], out: FromConfig) -> None:
    """``--optimizer-cpu-offload`` as ``offload_optimizer``: Megatron asserts it runs with
    ``--use-precision-aware-optimizer`` (arguments.py, whose hybrid device optimizer reuses that path), and its
    ``--optimizer-offload-fraction`` (default 1.0) below 1 keeps part of the state on the GPU."""
    src = out.source
    fraction = _one(values, "--optimizer-offload-fraction", src)
    if "--optimizer-cpu-offload" not in values:
        for flag in ("--optimizer-offload-fraction", "--overlap-cpu-optimizer-d2h-h2d"):
            if flag in values:
                out.notes.append(f"{flag}: read only with --optimizer-cpu-offload; ignored")
        return
    if "--use-precision-aware-optimizer" not in values:
        raise ConfigError(f"{src}: --optimizer-cpu-offload needs --use-precision-aware-optimizer (Megatron asserts it)")
    out.options["offload_optimizer"] = True
    if "--overlap-cpu-optimizer-d2h-h2d" in values:
        out.options["offload_overlap"] = True
    try:
        partial = fraction is not None and float(fraction) != 1.0
    except ValueError:
        raise ConfigError(f"{src}: --optimizer-offload-fraction {fraction!r} is not a number") from None
    if partial:
        out.notes.append(f"--optimizer-offload-fraction {fraction}: a partial offload is not modelled (the whole "
                         "optimizer is costed on the host)")  # fmt: skip


def _plan(values: dict[str, list[str]], out: FromConfig) -> None:
    src, opts = out.source, out.options
    for flag, key in (
        ("--tensor-model-parallel-size", "tp"),
        ("--pipeline-model-parallel-size", "pp"),
        ("--context-parallel-size", "cp"),
        ("--expert-model-parallel-size", "ep"),
        ("--expert-tensor-parallel-size", "etp"),
        ("--micro-batch-size", "micro_batch"),
        ("--global-batch-size", "global_batch"),
        ("--seq-length", "seq_len"),
        ("--virtual-pipeline-model-parallel-size", "vpp"),
        ("--num-virtual-stages-per-pipeline-rank", "vpp"),
    ):
        value = _int(values, flag, src)
        if value is not None:
            opts[key] = value
    if "--micro-batch-size" not in values:
        opts["micro_batch"] = 1  # echosim's default; Megatron requires the flag
        out.notes.append("--micro-batch-size not given: 1")
    per_stage = _int(values, "--num-layers-per-virtual-pipeline-stage", src)
    if per_stage:
        layers = _int(values, "--num-layers", src) or 0
        pp = opts.get("pp", 1)
        if layers % (pp * per_stage):
            raise ConfigError(
                f"{src}: --num-layers {layers} is not a multiple of --pipeline-model-parallel-size {pp} x "
                f"--num-layers-per-virtual-pipeline-stage {per_stage}"
            )
        opts["vpp"] = layers // (pp * per_stage)
    _pipeline_layout(values, out)
    _uneven_pipeline(values, out)
    if opts.get("vpp", 1) > 1:
        opts["schedule"] = "interleaved"
    if "--sequence-parallel" in values:
        # arguments.py turns sequence parallelism off when the tensor-parallel size is 1
        opts["sp"] = opts.get("tp", 1) > 1
    if "--use-distributed-optimizer" in values:
        opts["zero"] = 1
    if "--use-megatron-fsdp" in values:
        strategy = _one(values, "--data-parallel-sharding-strategy", src) or "optim_grads_params"
        if strategy not in FSDP_SHARDING:
            raise ConfigError(
                f"{src}: --data-parallel-sharding-strategy {strategy!r} (Megatron knows {', '.join(FSDP_SHARDING)})"
            )
        opts["zero"] = FSDP_SHARDING[strategy]
        _fsdp_grad_comm(values, out)
    elif "--use-torch-fsdp2" in values:
        opts["zero"] = 3  # PyTorch FSDP2's fully_shard: parameters, gradients and optimizer state
    elif "--data-parallel-sharding-strategy" in values:
        out.notes.append("--data-parallel-sharding-strategy: read only with --use-megatron-fsdp; ignored")
    _offload(values, out)
    if "--overlap-moe-expert-parallel-comm" in values:
        opts["moe_ep_overlap"] = True
    if "--tp-comm-overlap" in values:
        opts["tp_overlap"] = True
    if "--fp8-format" in values or "--fp8" in values:
        opts["dtype"] = _fp8_dtype(values, out)
    elif "--bf16" in values:
        opts["dtype"] = "bf16"
    elif "--fp16" in values:
        opts["dtype"] = "fp16"
    else:
        opts["dtype"] = "fp32"
        out.notes.append(f"neither --fp16 nor --bf16: fp32 training, Megatron's default ({ARGS})")
    granularity = _one(values, "--recompute-granularity", src)
    if "--recompute-activations" in values and granularity is None:
        granularity = "selective"  # arguments.py: --recompute-activations sets granularity selective
    if granularity is not None:
        if granularity not in ("full", "selective"):
            raise ConfigError(f"{src}: --recompute-granularity {granularity!r} (Megatron knows full, selective)")
        opts["recompute"] = granularity
    _recompute_modules(values, granularity, out)
    method = _one(values, "--recompute-method", src)
    if method is not None and method not in ("uniform", "block"):
        raise ConfigError(f"{src}: --recompute-method {method!r} (Megatron knows uniform, block)")
    # block: the first N layers of each (virtual) pipeline stage are checkpointed, the rest keep their activations
    # (megatron/core/recompute.py checkpointed_forward, ``layer_idx < recompute_num_layers``; N defaults to 1,
    # arguments.py): echosim's full:N. N = 0 checkpoints no layer
    layers = _int(values, "--recompute-num-layers", src, 1) or 0
    if granularity == "full" and method == "block":
        if layers < 0:
            raise ConfigError(f"{src}: --recompute-num-layers {layers}: a layer count is at least 0")
        opts["recompute"] = f"full:{layers}" if layers else "none"
        if not layers:
            out.notes.append("--recompute-method block --recompute-num-layers 0: no layer is recomputed")
    # uniform: one checkpoint per chunk of N layers of a stage, the chunk replayed together (the same function):
    # echosim's full:uniform-N; N = 1 is full
    if granularity == "full" and method == "uniform":
        if layers < 1:
            raise ConfigError(
                f"{src}: --recompute-method uniform --recompute-num-layers {layers}: a chunk holds at least 1 layer"
            )
        if layers > 1:
            opts["recompute"] = f"full:uniform-{layers}"
    _optimizer_dtypes(values, out)
    _grad_dtype(values, out)
    comm = _cp_comm_type(values, src)
    if comm is not None:
        if comm not in ("p2p", "all_gather", "a2a", "a2a+p2p"):
            raise ConfigError(f"{src}: --cp-comm-type {comm!r} is not modelled (p2p, all_gather, a2a, a2a+p2p are)")
        opts["cp_comm"] = comm
    _hierarchical_cp(values, comm, out)
    capacity = _one(values, "--moe-expert-capacity-factor", src)
    if capacity is not None:
        opts["moe_capacity_factor"] = as_float(capacity, "--moe-expert-capacity-factor", src)
    if "--moe-pad-expert-input-to-capacity" in values:
        opts["moe_pad_to_capacity"] = True
    # TransformerConfig: moe_token_dispatcher_type 'allgather' | 'alltoall' | 'flex', and the flex
    # dispatcher's moe_flex_dispatcher_backend defaults to 'deepep'; --moe-enable-deepep sets both
    # (megatron/core/transformer/transformer_config.py, commit d98e8a6)
    dispatcher = _one(values, "--moe-token-dispatcher-type", src) or "allgather"
    backend = _one(values, "--moe-flex-dispatcher-backend", src) or "deepep"
    if "--moe-enable-deepep" in values or (dispatcher == "flex" and backend == "deepep"):
        opts["moe_dispatcher"] = "deepep"
    elif dispatcher == "flex" and backend == "hybridep":
        opts["moe_dispatcher"] = "hybridep"
    elif dispatcher != "alltoall" and "--moe-token-dispatcher-type" in values:
        what = f"flex dispatcher with {backend}" if dispatcher == "flex" else f"{dispatcher} dispatcher"
        out.notes.append(f"--moe-token-dispatcher-type {dispatcher}: the {what} is not modelled (costed as all-to-all)")
    for flag, key in (
        ("--moe-router-num-groups", "moe_router_groups"),
        ("--moe-router-group-topk", "moe_router_group_topk"),
    ):
        if (value := _one(values, flag, src)) is not None:
            opts[key] = as_int(value, flag, src)
    backend = _one(values, "--attention-backend", src)
    if backend in ("flash", "fused", "local", "unfused"):
        opts["attention"] = "flash" if backend in ("flash", "fused") else "math"
    elif backend not in (None, "auto"):
        raise ConfigError(f"{src}: --attention-backend {backend!r} (Megatron knows auto, flash, fused, unfused, local)")
    if "--use-flash-attn" in values:
        opts["attention"] = "flash"
    if "--overlap-grad-reduce" not in values:
        out.notes.append(
            "--overlap-grad-reduce not given: Megatron reduces gradients after the backward pass; "
            "echosim overlaps the data-parallel reduction with it"
        )


def _pipeline_layout(values: dict[str, list[str]], out: FromConfig) -> None:
    """``--pipeline-model-parallel-layout``: echosim's ``layout:`` balance, and the virtual stages per rank it
    implies (arguments.py: the layout's stages over the pipeline size; no other virtual-stage flag with it)."""
    src, opts = out.source, out.options
    layout = _one(values, "--pipeline-model-parallel-layout", src)
    if layout is None:
        return
    other = [f for f in ("--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
                         "--num-virtual-stages-per-pipeline-rank") if f in values]  # fmt: skip
    if other:
        raise ConfigError(f"{src}: --pipeline-model-parallel-layout and {other[0]} both set the virtual stages")
    try:
        stages = len(layout_counts(layout))
    except LayoutError as exc:
        raise ConfigError(f"{src}: --pipeline-model-parallel-layout: {exc}") from None
    pp = opts.get("pp", 1)
    if stages % pp:
        raise ConfigError(
            f"{src}: --pipeline-model-parallel-layout has {stages} stages, not a multiple of "
            f"--pipeline-model-parallel-size {pp}"
        )
    opts["vpp"] = stages // pp
    opts["pp_balance"] = f"layout:{layout}"


_UNEVEN = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
_ACCOUNT = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")


def _uneven_pipeline(values: dict[str, list[str]], out: FromConfig) -> None:
    """Megatron-Core's uneven pipeline splits as the ``layout:`` balance they amount to.

    ``--decoder-first/last-pipeline-num-layers`` give the first and last pipeline ranks their layers and split the
    rest evenly over the ranks between; ``--account-for-embedding/loss-in-pipeline-split`` count the embedding and
    the loss as a layer each, taken from the first rank's first and the last rank's last virtual stage
    (megatron/core/transformer/transformer_block.py ``get_num_layers_to_build`` and TransformerConfig's checks,
    commit d98e8a6). A rank's layers are split evenly over its virtual stages, virtual stage ``v`` of rank ``r``
    running at ``v * pp + r``."""
    src, opts = out.source, out.options
    uneven = [f for f in _UNEVEN if f in values]
    account = [f for f in _ACCOUNT if f in values]
    if not uneven and not account:
        return
    given = (uneven + account)[0]
    if "--pipeline-model-parallel-layout" in values:
        raise ConfigError(f"{src}: --pipeline-model-parallel-layout and {given} both set the pipeline split")
    if uneven and account:
        raise ConfigError(f"{src}: {uneven[0]} and {account[0]} cannot be set together (Megatron-Core refuses it)")
    pp, vpp = opts.get("pp", 1), opts.get("vpp", 1)
    if pp == 1:
        out.notes.append(f"{given}: no pipeline parallelism, ignored")
        return
    layers = _int(values, "--num-layers", src) or 0
    first, last = (_int(values, f, src) for f in _UNEVEN)
    if uneven:
        ends = [n for n in (first, last) if n is not None]
        if any(n <= 0 for n in ends):
            raise ConfigError(f"{src}: {given} must be larger than 0")
        middle_ranks = pp - len(ends)
        rest = layers - sum(ends)
        if rest < 0 or (middle_ranks and rest % middle_ranks) or (not middle_ranks and rest):
            raise ConfigError(
                f"{src}: {' and '.join(uneven)}: the {rest} of --num-layers {layers} left for {middle_ranks} "
                "pipeline ranks do not split evenly over them"
            )
        per = rest // middle_ranks if middle_ranks else 0
        ranks = [per] * pp
        ranks[0] = first if first is not None else per
        ranks[-1] = last if last is not None else per
    else:
        total = layers + len(account)
        if total % pp:
            raise ConfigError(
                f"{src}: --num-layers {layers} plus the embedding and loss counted ({len(account)}) is not a "
                f"multiple of --pipeline-model-parallel-size {pp}"
            )
        ranks = [total // pp] * pp
    if any(n % vpp for n in ranks):
        odd = next(n for n in ranks if n % vpp)
        raise ConfigError(f"{src}: a pipeline rank's layers ({odd}) do not split over {vpp} virtual stages")
    stages = [ranks[i % pp] // vpp for i in range(pp * vpp)]
    if "--account-for-embedding-in-pipeline-split" in values:
        stages[0] -= 1
    if "--account-for-loss-in-pipeline-split" in values:
        stages[-1] -= 1
    if min(stages) < 0:
        raise ConfigError(f"{src}: {given}: a virtual stage has no layer left for the embedding or the loss")
    body = ["t" * n for n in stages]
    body[0], body[-1] = "E" + body[0], body[-1] + "L"
    opts["pp_balance"] = "layout:" + "|".join(body)


def _fp8_dtype(values: dict[str, list[str]], out: FromConfig) -> str:
    """The GEMM format of an FP8 run: ``mxfp8`` for ``--fp8-recipe mxfp8`` (Blackwell's block-scaled MMA), else
    fp8 with one scale per tensor."""
    recipe = _one(values, "--fp8-recipe", out.source) or "delayed"
    if recipe not in FP8_RECIPES:
        raise ConfigError(f"{out.source}: --fp8-recipe {recipe!r} (Megatron knows {', '.join(FP8_RECIPES)})")
    if recipe in ("blockwise", "custom"):
        out.notes.append(f"--fp8-recipe {recipe}: costed as FP8 GEMMs with one scale per tensor")
    return "mxfp8" if recipe == "mxfp8" else "fp8"


def _recompute_modules(values: dict[str, list[str]], granularity: str | None, out: FromConfig) -> None:
    """``--recompute-modules`` under selective recompute: ``selective:MODULES`` of those echosim models, a note
    for the others (Megatron's default is core_attn alone)."""
    modules = values.get("--recompute-modules")
    if modules is None:
        return
    bad = [m for m in modules if m not in RECOMPUTE_MODULES]
    if bad or not modules:
        raise ConfigError(
            f"{out.source}: --recompute-modules {(bad or ['(none)'])[0]!r} is not a Megatron-Core module "
            f"({', '.join(RECOMPUTE_MODULES)})"
        )
    if granularity != "selective":
        out.notes.append("--recompute-modules: read only with --recompute-granularity selective; ignored")
        return
    known = [m for m in modules if m in MEGATRON_MODULES]
    other = [m for m in modules if m not in MEGATRON_MODULES]
    if other:
        out.notes.append(
            f"--recompute-modules {' '.join(other)}: not modelled (echosim recomputes {', '.join(MEGATRON_MODULES)})"
        )
    out.options["recompute"] = "selective:" + ",".join(known) if known else "none"


def _devices(launcher: list[str], out: FromConfig) -> None:
    """``torchrun --nproc_per_node 8 --nnodes 2`` (or deepspeed's --num_gpus/--num_nodes): 16 devices."""
    per_node = nodes = None
    for i, word in enumerate(launcher[:-1]):
        flag, _, inline = word.partition("=")
        value = inline or launcher[i + 1]
        if flag in ("--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num-gpus") and value.isdigit():
            per_node = int(value)
        elif flag in ("--nnodes", "--num_nodes", "--num-nodes") and value.isdigit():
            nodes = int(value)
    if per_node is not None:
        out.options["devices"] = per_node * (nodes or 1)
        out.notes.append(
            f"devices from the launcher: {per_node} per node x {nodes or 1} node(s) = {per_node * (nodes or 1)}"
        )


def _model(values: dict[str, list[str]], out: FromConfig, source: str) -> Any:
    """The network the arguments describe, or ``None`` when they give no sizes (a model must be named)."""
    need = ("--num-layers", "--hidden-size", "--num-attention-heads")
    if not any(flag in values for flag in need):
        return None
    missing = [flag for flag in need if flag not in values]
    if missing:
        raise ConfigError(f"{source}: {', '.join(missing)} not given (the model's sizes are incomplete)")
    layers = _int(values, "--num-layers", source) or 0
    hidden = _int(values, "--hidden-size", source) or 0
    heads = _int(values, "--num-attention-heads", source) or 0
    swiglu = "--swiglu" in values
    experts = _int(values, "--num-experts", source, 0) or 0
    ffn = _int(values, "--ffn-hidden-size", source)
    if ffn is None:
        # arguments.py: 4h, or with --swiglu int((4h * 2/3) / 64) * 64 (the same parameter count)
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
    head_dim = _int(values, "--kv-channels", source, 0) or 0
    kv = heads
    if "--group-query-attention" in values:
        kv = _int(values, "--num-query-groups", source, 1) or 1
    latent = _latent_attention(values, source)
    if latent:
        if kv != heads:
            raise ConfigError(f"{source}: --multi-latent-attention with --group-query-attention (Megatron allows one)")
        head_dim = latent.pop("head_dim")
    elif "--qk-layernorm" in values:
        out.notes.append("--qk-layernorm: not modelled (the query and key normalisation)")
    seq = _int(values, "--seq-length", source)
    if seq is None:
        seq = _int(values, "--max-position-embeddings", source)
    if seq is None:
        raise ConfigError(f"{source}: --seq-length not given")
    vocab = _vocab(values, out, source)
    tied = "--untie-embeddings-and-output-weights" not in values
    arch = "moe" if experts else ("llama" if swiglu else "gpt")
    dropout = as_float(_one(values, "--hidden-dropout", source) or "0.1", "--hidden-dropout", source)
    norm = _one(values, "--normalization", source) or "LayerNorm"
    positions = _one(values, "--position-embedding-type", source) or "learned_absolute"
    if "--no-position-embedding" in values and positions == "learned_absolute":
        positions = "none"
    if arch == "gpt":
        if kv != heads:
            raise ConfigError(
                f"{source}: --group-query-attention without --swiglu: grouped-query attention in the GELU "
                "(GPT) block is not modelled"
            )
        if positions != "learned_absolute":
            out.notes.append(f"--position-embedding-type {positions}: the GPT block is costed with learned positions")
        if norm != "LayerNorm":
            out.notes.append(f"--normalization {norm}: the GPT block is costed with LayerNorm")
        if "--disable-bias-linear" in values:
            out.notes.append("--disable-bias-linear: the GPT block is costed with biases")
    else:
        if norm != "RMSNorm":
            out.notes.append(f"--normalization {norm}: the SwiGLU block is costed with RMSNorm")
        if positions != "rope":
            out.notes.append(f"--position-embedding-type {positions}: the SwiGLU block is costed with rotary positions")
        if dropout > 0 or "--attention-dropout" not in values:
            out.notes.append("dropout (0.1 unless set to 0, Megatron's default) is not in echosim's SwiGLU block")
        dropout = 0.0
        if experts and not swiglu:
            out.notes.append("--num-experts without --swiglu: the experts are costed as SwiGLU")
    moe: dict[str, int] = {}
    if experts:
        moe_ffn = _int(values, "--moe-ffn-hidden-size", source, ffn) or ffn
        shared_size = _int(values, "--moe-shared-expert-intermediate-size", source, 0) or 0
        if shared_size % moe_ffn:
            raise ConfigError(
                f"{source}: --moe-shared-expert-intermediate-size {shared_size} is not a multiple of the "
                f"expert width {moe_ffn}"
            )
        moe = {
            "experts": experts,
            "top_k": _int(values, "--moe-router-topk", source, 2) or 2,  # arguments.py: moe_router_topk=2
            "moe_ffn": moe_ffn,
            "shared_experts": shared_size // moe_ffn,
            **_moe_layers(values, layers, out, source),
        }
        if "--moe-grouped-gemm" not in values:
            out.notes.append(
                "--moe-grouped-gemm not given: Megatron runs SequentialMLP, one GEMM per expert; echosim costs the "
                "experts' grouped kernel"
            )
    mtp = _int(values, "--mtp-num-layers", source, 0) or 0
    if mtp and not experts:
        out.notes.append(f"--mtp-num-layers {mtp}: not modelled for a dense model (echosim's MTP follows a MoE model)")
        mtp = 0
    cfg = ArchConfig(
        arch,
        layers,
        hidden,
        heads,
        vocab,
        ffn=ffn,
        kv_heads=kv,
        head_dim=head_dim,
        seq_len=seq,
        dropout=dropout,
        tied_embeddings=tied,
        **moe,
        **latent,
        **({"mtp_layers": mtp} if mtp else {}),
    )
    return model_or_zoo(cfg, source)


def _latent_attention(values: dict[str, list[str]], source: str) -> dict[str, int]:
    """MLA's sizes under ``--multi-latent-attention`` (arguments.py defaults: no query latent, kv latent 32, query/key
    head 128 + 64 rotary, value head 128); ``head_dim`` is the query/key head, as :class:`ArchConfig` counts it."""
    if "--multi-latent-attention" not in values:
        return {}
    qk = _int(values, "--qk-head-dim", source, 128) or 128
    rope = _int(values, "--qk-pos-emb-head-dim", source, 64) or 64
    return {
        "head_dim": qk + rope,
        "kv_lora_rank": _int(values, "--kv-lora-rank", source, 32) or 32,
        "q_lora_rank": _int(values, "--q-lora-rank", source, 0) or 0,
        "rope_head_dim": rope,
        "v_head_dim": _int(values, "--v-head-dim", source, 128) or 128,
    }


#: The longest --moe-layer-freq pattern read (a repeat count beyond it is refused, not expanded).
MAX_PATTERN_LAYERS = 100_000


def moe_layer_pattern(text: str, layers: int, source: str) -> list[int]:
    """``--moe-layer-freq`` as one 0/1 per layer (1: MoE). An integer N puts a MoE layer at every layer i with
    i % N == 0; a list expression such as ``([0]*3+[1]*58)`` or ``([1]*3+[0]*1)*3`` (arguments.py ``moe_freq_type``
    evaluates it as Python) is read as sums and repeats of ``[0/1, ...]`` lists; its length must be the layer count."""
    if layers > MAX_PATTERN_LAYERS:
        raise ConfigError(f"{source}: --moe-layer-freq over --num-layers {layers}: at most {MAX_PATTERN_LAYERS} layers")
    body = text.replace(" ", "")
    if body.strip("()").isdigit():
        step = int(body.strip("()"))
        if step < 1:
            raise ConfigError(f"{source}: --moe-layer-freq {text!r}: the frequency must be 1 or more")
        return [1 if i % step == 0 else 0 for i in range(layers)]
    try:
        pattern, end = _freq_sum(body, 0)
        if end != len(body):
            raise ValueError(end)
    except (ValueError, IndexError):
        raise ConfigError(
            f"{source}: --moe-layer-freq {text!r}: echosim reads an integer or sums and repeats of [0/1, ...] lists"
        ) from None
    if len(pattern) != layers:
        raise ConfigError(f"{source}: --moe-layer-freq {text!r} has {len(pattern)} layers, --num-layers {layers}")
    return pattern


def _freq_sum(body: str, i: int) -> tuple[list[int], int]:
    """``term (+ term)*`` of a --moe-layer-freq list expression from position ``i``: (the list, where it ends)."""
    out, i = _freq_term(body, i)
    while i < len(body) and body[i] == "+":
        more, i = _freq_term(body, i + 1)
        out += more
    return out, i


def _freq_term(body: str, i: int) -> tuple[list[int], int]:
    """``[0,1,...]`` or ``(sum)``, optionally ``*n``."""
    if body[i] == "[":
        close = body.index("]", i)
        items = [int(x) for x in body[i + 1 : close].split(",")]
        if any(x not in (0, 1) for x in items):
            raise ValueError(items)
        out, i = items, close + 1
    elif body[i] == "(":
        out, i = _freq_sum(body, i + 1)
        if body[i] != ")":
            raise ValueError(i)
        i += 1
    else:
        raise ValueError(i)
    if i < len(body) and body[i] == "*":
        digits = re.match(r"\d+", body[i + 1 :])
        if digits is None or len(out) * int(digits.group()) > MAX_PATTERN_LAYERS:
            raise ValueError(i)
        out, i = out * int(digits.group()), i + 1 + len(digits.group())
    return out, i


def _moe_layers(values: dict[str, list[str]], layers: int, out: FromConfig, source: str) -> dict[str, int]:
    """``dense_layers`` or ``moe_layer_step`` (:class:`ArchConfig`, which takes one or the other) for
    ``--moe-layer-freq``: a MoE layer at every layer i with (i + 1) % step == 0, or dense first layers, then MoE."""
    text = _one(values, "--moe-layer-freq", source)
    if text is None:
        return {}
    pattern = moe_layer_pattern(text, layers, source)
    dense = next((i for i, x in enumerate(pattern) if x), layers)
    step = dense + 1  # a step pattern's first MoE layer is layer step - 1
    if all(x == ((i + 1) % step == 0) for i, x in enumerate(pattern)):
        return {"moe_layer_step": step} if step > 1 else {}
    if dense < layers and all(pattern[dense:]):
        return {"dense_layers": dense}
    plain = text.replace(" ", "").strip("()")
    if plain.isdigit():  # Megatron's i % N == 0 puts the first MoE layer first; echosim's rule puts it at N - 1
        step = int(plain)
        echo = sum((i + 1) % step == 0 for i in range(layers))
        out.notes.append(
            f"--moe-layer-freq {step}: Megatron's MoE layers are 0, {step}, {2 * step}, ... ({sum(pattern)} of them); "
            f"echosim places every {step}-th from layer {step - 1} ({echo})"
        )
        return {"moe_layer_step": step}
    raise ConfigError(
        f"{source}: --moe-layer-freq {text!r}: echosim models dense layers first, then MoE layers, or a MoE layer "
        "every step-th layer"
    )


def _vocab(values: dict[str, list[str]], out: FromConfig, source: str) -> int:
    """The padded vocabulary Megatron builds: the tokenizer's size rounded up to a multiple of
    ``--make-vocab-size-divisible-by`` (128) x tensor-parallel size (``_vocab_size_with_padding``)."""
    tokenizer = _one(values, "--tokenizer-type", source) or ""
    given = _int(values, "--vocab-size", source)
    if tokenizer == "NullTokenizer":
        if given is None:
            raise ConfigError(f"{source}: --tokenizer-type NullTokenizer needs --vocab-size")
        size = given + 1  # NullTokenizer.vocab_size adds the end-of-document token
    elif given is not None:
        size = given
    elif tokenizer in TOKENIZER_VOCAB:
        size = TOKENIZER_VOCAB[tokenizer]
    elif tokenizer == "" and "--vocab-file" in values:
        size = TOKENIZER_VOCAB["GPT2BPETokenizer"]  # a GPT-2 vocab file with the default tokenizer
    else:
        raise ConfigError(
            f"{source}: --vocab-size not given and --tokenizer-type {tokenizer or '(none)'} reads its size from "
            "files echosim does not have: add --vocab-size, or name the MODEL"
        )
    divisible = _int(values, "--make-vocab-size-divisible-by", source, 128) or 128
    multiple = divisible * (_int(values, "--tensor-model-parallel-size", source, 1) or 1)
    return math.ceil(size / multiple) * multiple
