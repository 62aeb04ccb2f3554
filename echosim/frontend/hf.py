"""``hf:`` sources: a transformers ``config.json`` built with ``AutoModelForCausalLM.from_config`` on ``meta``
(or as the masked LM, classifier or encoder-decoder its ``architectures`` names: :func:`head_class`).

``hf:path/to/config.json``, ``hf:path/to/dir`` (holding ``config.json``) or
``hf:NAME`` for a config shipped in ``echosim/frontend/configs``. Nothing is
downloaded and no weight is allocated. transformers is the optional extra
``echosim[hf]``.

The model is exported with ``torch.export`` after its longest run of identical
decoder layers is cut to two copies; once they are shown to be one chain the
second is dropped (``fold.py``, the folding every frontend uses), so a Llama-3 70B
captures as one layer with a repeat count of 80. Attention runs through an ``echosim`` attention
function registered with transformers: causal SDPA with grouped-query heads and no
mask tensor (the kernel training stacks use), so transformers builds no mask and
no mask arithmetic is costed. The loss is added by :mod:`echosim.frontend.loss`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError
from echosim.frontend.messages import Note

if TYPE_CHECKING:
    from echosim.frontend.spec import Capture, CaptureSpec

CONFIGS = Path(__file__).parent / "configs"
EXTRA = "pip install 'echosim[hf]'"
# A config's max_position_embeddings is what the model can address, not what it trains on;
# without --seq-len the sequence is that, capped here (Llama 3 pre-trained at 8192 tokens).
DEFAULT_SEQ_CAP = 8192
ATTENTION = "echosim"


def shipped() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.json"))


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise EchosimError(f"the hf: frontend needs transformers, which is not installed: {EXTRA}") from None
    return transformers


def config_path(source: str) -> Path:
    """``hf:X`` -> the config.json it names (a file, a directory holding one, or a shipped name)."""
    spec = source.removeprefix("hf:").strip()
    if not spec:
        raise EchosimError("hf: needs a config.json, a directory holding one, or a shipped name")
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise EchosimError(f"hf: directory {spec!r} has no config.json")
        return path
    if path.is_file():
        return path
    named = CONFIGS / f"{spec}.json"
    if "/" not in spec and named.is_file():
        return named
    known = ", ".join(shipped())
    raise EchosimError(f"hf: no config.json at {spec!r} (echosim downloads nothing; local paths or: {known})")


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EchosimError(f"{path} is not a readable JSON config: {exc}") from None
    if not isinstance(data, dict):
        raise EchosimError(f"{path} is not a JSON object")
    data = _special_floats(data)
    if "model_type" not in data:
        raise EchosimError(f"{path} has no model_type: not a transformers config")
    if not isinstance(data["model_type"], str):
        raise EchosimError(f"{path}: model_type must be a string, got {data['model_type']!r:.60}")
    _check_sizes(path, data)
    return data


#: How transformers' ``to_json_file`` writes the floats JSON has no literal for (Bamba's ``time_step_limit``
#: ends in infinity): ``{"__float__": "Infinity"}``; its own reader turns them back into floats.
_FLOAT_TAGS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _special_floats(value: Any) -> Any:
    if isinstance(value, dict):
        if value.keys() == {"__float__"} and value["__float__"] in _FLOAT_TAGS:
            return _FLOAT_TAGS[value["__float__"]]
        return {k: _special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_special_floats(v) for v in value]
    return value


#: transformers builds every decoder layer on ``meta`` before the fold keeps two: 10^4 layers ran past the
#: 300 s capture guard on a loaded 2-core machine (benchmarks/limits.py); the deepest published model has 126.
MAX_LAYERS = 1_000
#: Any integer of a config (a size, a count): beyond it a tensor size overflows 64 bits.
MAX_CONFIG_INT = 2**40
_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")


def _check_sizes(path: Path, data: dict[str, Any], where: str = "") -> None:
    """Refuse, naming the limit, a config whose sizes would take minutes or overflow before capture starts."""
    for key, value in data.items():
        if isinstance(value, dict):
            _check_sizes(path, value, f"{where}{key}.")
        elif isinstance(value, int) and not isinstance(value, bool):
            if key in _LAYER_KEYS and value > MAX_LAYERS:
                raise EchosimError(f"{path}: {where}{key} = {value} exceeds the limit of {MAX_LAYERS} layers")
            if abs(value) > MAX_CONFIG_INT:
                raise EchosimError(f"{path}: {where}{key} = {value} exceeds the limit of {MAX_CONFIG_INT} (2^40)")


class _Said(logging.Handler):
    """Keeps what transformers' loggers say at warning level and above, each message on one line (to give it back
    as notes)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(" ".join(record.getMessage().split()))


def build_config(path: Path) -> Any:
    """The transformers config of ``path`` (what transformers says about it is dropped: :func:`read_model_config`)."""
    return read_model_config(path)[0]


def read_model_config(path: Path) -> tuple[Any, list[Note]]:
    """The transformers config of ``path`` and what transformers warned while building it, as notes.

    transformers checks fields echosim never reads (a ``bos_token_id`` outside the vocabulary) and logs to stderr
    in its own format; a report keeps those lines among its notes instead, each once and naming transformers."""
    data = read_config(path)
    transformers = _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = data["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise EchosimError(
            f"{path}: unknown model_type {model_type!r} (transformers {transformers.__version__} does not know it)"
        )
    logger = logging.getLogger("transformers")
    said = _Said()
    # transformers' own stderr handler sits on this logger and it does not propagate: its level gates both
    handlers, level = list(logger.handlers), logger.level
    for h in handlers:
        logger.removeHandler(h)
    logger.addHandler(said)
    logger.setLevel(logging.WARNING)
    try:
        config = CONFIG_MAPPING[model_type].from_dict(dict(data))
    except Exception as exc:
        raise EchosimError(f"{path}: transformers rejected the config: {' '.join(str(exc).split())}") from None
    finally:
        logger.removeHandler(said)
        for h in handlers:
            logger.addHandler(h)
        logger.setLevel(level)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not head_class(config, transformers):
        named = ", ".join(data.get("architectures") or []) or "none"
        raise EchosimError(
            f"{path}: model_type {model_type!r} has no causal-LM model in transformers, and its architectures "
            f"({named}) name no model echosim builds (a masked LM, a classifier, an encoder-decoder)"
        )
    return config, [Note(f"transformers on {path.name}: {line}") for line in dict.fromkeys(said.lines)]


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _attention)


@contextmanager
def _mask_tensors() -> Iterator[None]:
    """While active, transformers builds SDPA's causal mask as a tensor for ``echosim``'s attention. Without a mask
    function registered it builds none, since the attention reads none; models that read the mask outside the
    attention call (MPT's blocks, GLM-5's sparse-attention indexer) fail on ``None``, so :func:`capture_config`
    tries them again under this. Registered only then: the mask arguments' checks read tensor values, which a
    model run eagerly on ``meta`` cannot."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def mask(*args: Any, **kwargs: Any) -> Any:
        return sdpa_mask(*args, **{**kwargs, "allow_is_causal_skip": False})

    AttentionMaskInterface.register(ATTENTION, mask)
    try:
        yield
    finally:
        AttentionMaskInterface._global_mapping.pop(ATTENTION, None)


def _attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: Any = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Causal SDPA on (batch, heads, seq, dim) with grouped-query heads; transformers' return layout.

    A mask is not read. A score bias per head is added to the scores, as the model does (SDPA's ``attn_mask``):
    T5's ``position_bias`` (its decoder adds the causal mask into it), or a floating-point mask with a head axis
    (Swin's relative position bias, its shifted windows' mask added in). Every key is scored then, as in the
    model, and the bias and the table it is looked up in are part of the step."""
    import torch
    import torch.nn.functional as F

    bias = kwargs.get("position_bias")
    per_head = isinstance(attention_mask, torch.Tensor) and attention_mask.is_floating_point()
    per_head = per_head and attention_mask.dim() == 4 and attention_mask.shape[1] > 1
    bias = bias if isinstance(bias, torch.Tensor) else attention_mask if per_head else None
    causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1 and bias is None
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


#: The model heads a config's ``architectures`` may name, built as named instead of as a causal LM: what BERT,
#: RoBERTa, ViT, T5, BART and Whisper configs were saved from and are trained as (bidirectional encoders, image
#: classifiers, encoder-decoders). A causal LM's own name (``LlamaForCausalLM``, ``GPT2LMHeadModel``) and any other
#: head keep the causal LM of ``model_type``.
HEADS = ("ForMaskedLM", "ForPreTraining", "ForSequenceClassification", "ForTokenClassification",
         "ForImageClassification", "ForConditionalGeneration", "MTModel")  # fmt: skip
#: Heads of an encoder-decoder only (Marian's translation model is ``MarianMTModel``); a decoder-only
#: ``...ForConditionalGeneration`` (a vision-language model) keeps the causal LM.
SEQ2SEQ = ("ForConditionalGeneration", "MTModel")


def head_class(config: Any, transformers: Any = None) -> str:
    """The transformers class the config names as its architecture where echosim builds that head (:data:`HEADS`;
    ``ForConditionalGeneration`` only for an encoder-decoder), else ``""``: the causal LM."""
    names = getattr(config, "architectures", None) or []
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else ""
    if not name.endswith(HEADS) or (name.endswith(SEQ2SEQ) and not config.is_encoder_decoder):
        return ""
    return name if hasattr(transformers or _transformers(), name) else ""


def build_model(config: Any, dtype: Any = None) -> Any:
    """The model on ``meta`` in bf16 (every float is costed in the capture's dtype anyway), in train mode: the head
    its ``architectures`` names (:func:`head_class`) or its causal LM; ``dtype``: another torch dtype to build it in."""
    import torch

    transformers = _transformers()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    _register_attention()
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.bfloat16)
    try:
        with torch.device("meta"):
            if head := head_class(config, transformers):
                model = getattr(transformers, head)._from_config(config, attn_implementation=ATTENTION)
            else:
                model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION)
    except Exception as exc:
        raise EchosimError(f"transformers could not build {config.model_type}: {exc}") from None
    finally:
        torch.set_default_dtype(default)
        logging.set_verbosity(verbosity)
    model.train()
    return model


@dataclass
class HFModel:
    """What the ``hf:`` loader returns; captured once the spec fixes batch, sequence and dtype."""

    source: str
    path: Path

    @property
    def name(self) -> str:
        return self.source

    def capture(self, spec: CaptureSpec) -> tuple[Any, list[str], int]:
        config, said = read_model_config(self.path)
        cap, params = capture_config(config, spec, self.source)
        return cap.graph, cap.warnings + cap.notes + said, params


def load(source: str) -> HFModel:
    """The ``hf:`` frontend loader (checks the config now; builds when captured)."""
    path = config_path(source)
    read_config(path)
    return HFModel(source, path)


def _logits_only(model: Any) -> Any:
    """``model(input_ids).logits`` as a module, so export sees one tensor in and one out."""
    import torch

    class CausalLM(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: Any) -> Any:
            return self.m(input_ids=input_ids, use_cache=False).logits

    return CausalLM(model)


def model_inputs(model: Any, config: Any, batch: int, seq: int) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The inputs of a head built from ``architectures`` (:func:`head_class`), by name: its main input (token ids,
    an image of the config's size, Whisper's log-mel frames) and an encoder-decoder's decoder token ids."""
    import torch

    main = getattr(model, "main_input_name", "input_ids")
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    dtype = next(model.parameters()).dtype
    size = getattr(config, "image_size", None)
    mel, frames = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
    if main == "input_ids":
        first = ids
    elif main == "pixel_values" and isinstance(size, (int, list, tuple)):
        side = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        first = torch.zeros(batch, getattr(config, "num_channels", 3), *side, dtype=dtype, device="meta")
    elif main == "input_features" and isinstance(mel, int) and isinstance(frames, int):
        # Whisper's encoder: two convolutions, the second of stride 2, turn 2 x max_source_positions frames into
        # its positions (30 s of audio at 100 frames a second: 3,000 frames, 1,500 positions)
        first = torch.zeros(batch, mel, 2 * frames, dtype=dtype, device="meta")
    else:
        raise EchosimError(f"{type(model).__name__} reads {main!r}, which echosim cannot make from the config")
    if getattr(config, "is_encoder_decoder", False):
        return (main, "decoder_input_ids"), (first, ids)
    return (main,), (first,)


def _outputs_first(model: Any, names: tuple[str, ...]) -> Any:
    """``model(**inputs)[0]`` as a module (the logits of a head called without labels), inputs given by position."""
    import inspect

    import torch

    cached = "use_cache" in inspect.signature(model.forward).parameters

    class Head(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, *tensors: Any) -> Any:
            kwargs = dict(zip(names, tensors, strict=True))
            return self.m(**kwargs, **({"use_cache": False} if cached else {}))[0]

    return Head(model)


def layer_windows(config: Any) -> dict[int, int]:
    """The sliding window of each local decoder layer, by layer index, from a transformers config.

    ``sliding_window`` is the window (HF: a query sees the ``sliding_window`` latest keys, itself
    included); which layers use it comes from ``layer_types`` (``"sliding_attention"``: Gemma 3,
    gpt-oss, Qwen2 with ``use_sliding_window``), else from ``sliding_window_pattern`` (older Gemma 3
    configs: every pattern-th layer is global), else every layer (Mistral 7B v0.1). A config with
    ``use_sliding_window: false`` (Qwen2's default) has none.
    """
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return {}
    if getattr(config, "use_sliding_window", True) is False:
        return {}
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)) and types:
        return {i: window for i, t in enumerate(types) if t == "sliding_attention"}
    pattern = getattr(config, "sliding_window_pattern", None)
    if isinstance(pattern, int) and pattern > 1:
        return {i: window for i in range(layers) if (i + 1) % pattern}
    return dict.fromkeys(range(layers), window)


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:(\d+)\.)?")


def _layer_index(graph: Any, scope: str, m: re.Match[str]) -> int:
    """The decoder layer a scope is in; inside a folded group of layers (``model.layers.0.2.self_attn``: the
    group's third layer, :class:`echosim.frontend.fold.LayerGroup`) the group's first layer index plus the
    position. Only the first group is kept, and every group holds the same kinds of layers in the same order."""
    index = int(m.group(1))
    if m.group(2) is not None and graph.layers_per_block(scope[: m.end(1)]) > 1:
        return index + int(m.group(2))
    return index


def apply_windows(graph: Any, windows: dict[int, int]) -> int:
    """Give the causal attention ops of the local layers their window; returns how many ops got one.

    The capture's attention is plain causal SDPA (:func:`_attention`); the scope names the layer
    (``model.layers.7.self_attn``). Folded runs hold layers of one kind (a layer's window is one of
    the settings :func:`echosim.frontend.fold.signature` compares), so the first layer's index speaks
    for the run.
    """
    from dataclasses import replace as _replace

    from echosim.ir.ops import AttentionAttrs, OpKind

    if not windows:
        return 0
    changed = 0
    for node in list(graph):
        if node.op is not OpKind.ATTENTION or not isinstance(node.attrs, AttentionAttrs) or not node.attrs.causal:
            continue
        m = _LAYER.search(node.scope)
        if m is None or (window := windows.get(_layer_index(graph, node.scope, m))) is None:
            continue
        if window < node.attrs.kv_len:  # a window as long as the sequence is full causal attention
            graph.replace(node.id, attrs=_replace(node.attrs, window=window))
            changed += 1
    return changed


_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_target_positions")


def _position_table(model: Any, positions: int) -> str:
    """The module path of a learned position-embedding table of ``positions`` rows (OPT's has 2 more), if any."""
    from torch import nn

    for path, module in model.named_modules():
        leaf = path.rpartition(".")[2].lower()
        learned = "pos" in leaf or leaf == "wpe"
        if learned and isinstance(module, nn.Embedding) and positions <= module.num_embeddings <= positions + 2:
            return path
    return ""


def _capture_retrying(capture: Callable[[Any], Capture], model: Any, config: Any) -> Capture:
    """``capture(model)``; where it fails, again with the causal mask built as a tensor (a model that reads the
    mask itself: MPT's blocks, the sparse-attention indexers), and where that fails on a dtype mix, with the
    model built in fp32 (xLSTM makes fp32 states of its own and mixes them with its weights, as it would under
    autocast; the IR costs every float in the capture's dtype anyway). If all fail, the first failure is raised."""
    import torch

    from echosim.frontend.spec import CaptureError

    try:
        return capture(model)
    except CaptureError as exc:
        first = exc
    try:
        with _mask_tensors():
            return capture(model)
    except CaptureError as again:
        if "scalar type" not in str(again) and "dtype" not in str(again):
            raise first from None
    try:
        return capture(build_model(config, torch.float32))
    except CaptureError:
        raise first from None


def capture_config(config: Any, spec: CaptureSpec, name: str, *, fold: bool = True) -> tuple[Capture, int]:
    """Build, fold, export and convert; returns the capture and the model's parameter count."""
    import torch

    from echosim.frontend.aten import capture_export
    from echosim.frontend.loss import ensure_loss
    from echosim.frontend.messages import Note
    from echosim.frontend.spec import CaptureError
    from echosim.ir.types import DType

    model = build_model(config)
    total = sum(p.numel() for p in model.parameters())
    # MPT names it max_seq_len, ChatGLM seq_length (GPT-2's n_positions is aliased by transformers)
    key, positions = next(
        ((k, v) for k in _POSITION_KEYS if isinstance(v := getattr(config, k, None), int) and not isinstance(v, bool)),
        ("max_position_embeddings", None),
    )
    seq = spec.seq_len or min(int(positions or 2048), DEFAULT_SEQ_CAP)
    notes: list[str] = []
    head = head_class(config)
    images = getattr(model, "main_input_name", "") == "pixel_values"
    if not spec.seq_len and not images:
        if positions is None:
            why = "the config has no max_position_embeddings"
        elif int(positions) > DEFAULT_SEQ_CAP:
            why = f"the config's {key} {int(positions)} capped at {DEFAULT_SEQ_CAP}"
        else:
            why = f"the config's {key}"
        notes.append(Note(f"sequence length {seq}: {why} (--seq-len overrides)"))
    ids = torch.zeros(spec.micro_batch, seq, dtype=torch.long, device="meta")
    longer = isinstance(positions, int) and 0 < positions < seq

    def capture(module: Any) -> Capture:
        if head:
            names, args = model_inputs(module, config, spec.micro_batch, seq)
            call = _outputs_first(module, names)
        else:
            call, args = _logits_only(module), (ids,)
        return capture_export(module, call, args, dtype=DType.parse(spec.dtype), name=name, strip="m.", fold=fold)

    try:
        cap = _capture_retrying(capture, model, config)
    except CaptureError as exc:
        beyond = f" (--seq-len {seq} exceeds the config's {int(positions)} positions)" if longer else ""
        raise EchosimError(f"{name}: {exc}{beyond}") from None
    if longer:
        if table := _position_table(model, int(positions)):
            cap.warnings.append(
                f"{name}: --seq-len {seq} exceeds the {int(positions)} rows of its learned position embeddings "
                f"({table}): the model cannot address those positions (costed as if it could)"
            )
        else:
            notes.append(f"--seq-len {seq} exceeds the config's {key} {int(positions)}")
    topk = getattr(config, "index_topk", None)  # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5)
    if isinstance(topk, int) and not isinstance(topk, bool) and 0 < topk < seq:
        cap.warnings.append(
            f"{name}: sparse attention ({topk} keys per query, config index_topk) is costed as dense causal "
            f"attention over {seq} tokens: its indexer is counted, the keys it leaves out are not"
        )
    ensure_loss(cap.graph, notes)
    windows = layer_windows(config)
    if apply_windows(cap.graph, windows):
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        notes.append(
            f"sliding-window attention of {max(windows.values())} keys on {len(windows)} of {layers} layers "
            "(config sliding_window, layer_types)"
        )
    cap.notes.extend(Note(n) if not isinstance(n, Note) else n for n in notes)
    captured = cap.graph.param_count()
    if captured != total:
        cap.warnings.append(
            f"{name}: the captured graph holds {captured:,} of the model's {total:,} parameters "
            "(the rest are never used in forward)"
        )
    return cap, total
