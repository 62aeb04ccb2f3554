"""Megatron-LM arguments (a launch script, a file of arguments, or a string) as a plan and a model.

Names and defaults are Megatron-LM's ``megatron/training/arguments.py`` (commit d98e8a6,
core_r0.x); what a script leaves out takes those defaults, and the framework's own
(:mod:`echosim.frameworks`, ``megatron``) fill the rest. The model is built from the
script's sizes (``--num-layers``, ``--hidden-size``, ...) and named after the zoo entry it
equals, if any.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from echosim.configs.base import ConfigError, FromConfig, as_float, as_int, model_or_zoo, read_text
from echosim.configs.shell import launch_command
from echosim.frameworks import loss_framework
from echosim.frontend.zoo import ArchConfig

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
)

#: Flags echosim understands but does not model: the effect each has is named in the note.
NOT_MODELLED = {
    "--overlap-param-gather": "the parameter all-gather overlap of the distributed optimizer",
    "--fp8-param-gather": "fp8 parameter all-gather",
    "--moe-grouped-gemm": "grouped expert GEMMs (experts are costed as separate GEMMs)",
    "--no-masked-softmax-fusion": "the unfused masked softmax",
    "--apply-layernorm-1p": "zero-centred LayerNorm weights",
    "--grad-reduce-in-bf16": "gradient reduction in bf16 (costed in the gradient dtype)",
    "--empty-unused-memory-level": "emptying the CUDA cache",
    "--rampup-batch-size": "the batch-size ramp of the first steps (the full batch is simulated)",
    "--fp8-amax-history-len": "fp8 scaling history",
    "--fp8-amax-compute-algo": "fp8 scaling",
    "--moe-router-dtype": "the router's dtype",
    "--attention-softmax-in-fp32": "softmax in fp32",
    "--accumulate-allreduce-grads-in-fp32": "fp32 gradient accumulation",
    "--transformer-impl": "the transformer implementation (Transformer Engine or local)",
}

#: Flags the reader consumes (their value is read into the plan or the model).
CONSUMED = {
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
    "--sequence-parallel",
    "--use-distributed-optimizer",
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
}


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


def _int(values: dict[str, list[str]], flag: str, source: str, default: int | None = None) -> int | None:
    text = _one(values, flag, source)
    return default if text is None else as_int(text, flag, source)


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
    if opts.get("vpp", 1) > 1:
        opts["schedule"] = "interleaved"
    if "--sequence-parallel" in values:
        # arguments.py turns sequence parallelism off when the tensor-parallel size is 1
        opts["sp"] = opts.get("tp", 1) > 1
    if "--use-distributed-optimizer" in values:
        opts["zero"] = 1
    if "--overlap-moe-expert-parallel-comm" in values:
        opts["moe_ep_overlap"] = True
    if "--tp-comm-overlap" in values:
        opts["tp_overlap"] = True
    if "--fp8-format" in values or "--fp8" in values:
        opts["dtype"] = "fp8"
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
    method = _one(values, "--recompute-method", src)
    if granularity == "full" and method == "block" and "--recompute-num-layers" in values:
        out.notes.append(
            "--recompute-method block --recompute-num-layers "
            f"{_one(values, '--recompute-num-layers', src)}: recomputing only some layers is not modelled "
            "(every layer is recomputed)"
        )
    comm = _one(values, "--cp-comm-type", src)
    if comm is not None:
        if comm not in ("p2p", "all_gather"):
            raise ConfigError(f"{src}: --cp-comm-type {comm!r} is not modelled (p2p, all_gather are)")
        opts["cp_comm"] = comm
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
        }
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
    )
    return model_or_zoo(cfg, source)


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
