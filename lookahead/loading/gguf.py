"""A GGUF loaded with its weights as shipped: linear layers and embeddings keep their block formats.

``load_quantized(gguf, header_dir)`` builds the transformers model from its
config without touching float weights (``no_init_weights``: the float
tensors it allocates are never written, then dropped), then reads the GGUF
once: a tensor in a block format the kernel reads (model/quantized.py) whose
module is an ``nn.Linear`` or ``nn.Embedding`` becomes a ``QuantizedLinear``
or ``QuantizedEmbedding`` over a copy of its blocks; every other tensor
(norms, biases; a block format the kernel does not read, or a module that is
no linear layer) is de-quantized by the ``gguf`` package as transformers
does, with one line on stderr for each kind of tensor so widened. Name
mapping and the per-architecture fix-ups (Llama's q/k row order, Gemma's
norm offset) are transformers' own (``modeling_gguf_pytorch_utils``): a
fix-up that only reorders rows is applied to the blocks' rows; any other
keeps that tensor in float. The name mapping is kept in the header
directory (``weights_map``): made once, read back by every later load.

An output head tied to the embedding shares the embedding's blocks.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import ModelLoadError, one_line
from ..model.quantized import BLOCKS, FORMAT_NAMES, QuantizedEmbedding, QuantizedLinear, takes

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FLOAT_TYPES = (0, 1, 30)  # GGML's F32, F16, BF16: float already, read as float32 without a word
HEADER_FILES = ("config.json",)  # what a built header directory always holds (tokenizer files besides)
WEIGHTS_MAP = "weights_map.json"  # in a header directory: GGUF tensor names -> parameter names (``weights_map``)


def build_header_dir(gguf: Path, target: Path) -> None:
    """Write the GGUF's config, generation config and tokenizer into ``target`` (small files, read in a second
    where the GGUF's own header takes transformers about ten seconds to parse)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(partial))
    GenerationConfig.from_model_config(config).save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    if not target.exists():
        partial.replace(target)


def header_ready(target: Path) -> bool:
    return all((target / name).is_file() for name in HEADER_FILES)


def _architecture(reader: Any) -> str:
    field = reader.fields.get("general.architecture")
    return bytes(field.parts[field.data[0]]).decode() if field is not None else "?"


def _row_order(processor: Any, name: str, rows: int, mapping: dict[str, str]) -> tuple[np.ndarray | None, str]:
    """The row permutation transformers' fix-up applies to tensor ``name`` (rows of the weight [rows, ...]) and
    the fixed-up name; None where the fix-up is more than a reordering of rows."""
    probe = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    result = processor.process(weights=probe, name=name, tensor_key_mapping=mapping, parsed_parameters={})
    order = np.asarray(result.weights)
    if order.shape != (rows, 1) or not np.array_equal(np.sort(order[:, 0]), probe[:, 0]):
        return None, result.name
    return order[:, 0].astype(np.int64), result.name


def _module_of(model: torch.nn.Module, hf_name: str) -> tuple[torch.nn.Module, str, str]:
    """(parent module, attribute name, parameter name) of a state-dict name ('model.layers.0.mlp.up_proj.weight')."""
    path, parameter = hf_name.rsplit(".", 1)
    parent_path, _, attribute = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    return parent, attribute, parameter


def _quantized_module(module: torch.nn.Module, blocks: torch.Tensor, code: int) -> torch.nn.Module | None:
    """The stand-in for ``module`` over ``blocks`` in format ``code``, or None where it cannot stand in."""
    if type(module) is torch.nn.Linear and takes(code, module.in_features) \
            and blocks.shape[0] == module.out_features:
        bias = module.bias.detach() if module.bias is not None else None
        return QuantizedLinear(blocks, code, module.in_features, module.out_features, bias)
    if isinstance(module, torch.nn.Embedding) and takes(code, module.embedding_dim) \
            and blocks.shape[0] == module.num_embeddings:
        scale = getattr(module, "embed_scale", None)
        scale = scale.detach().clone() if isinstance(scale, torch.Tensor) else \
            torch.tensor(float(scale)) if isinstance(scale, int | float) else None
        return QuantizedEmbedding(blocks, code, module.num_embeddings, module.embedding_dim, module.padding_idx, scale)
    return None


def _set_float(model: torch.nn.Module, hf_name: str, value: np.ndarray) -> None:
    """Give the model's parameter (or buffer) ``hf_name`` the float32 values ``value`` (reshaped to its shape)."""
    parent, attribute, parameter = _module_of(model, hf_name)
    module = getattr(parent, attribute)
    tensor = torch.from_numpy(np.array(value, dtype=np.float32))  # (a copy: the map is read-only)
    old = getattr(module, parameter)
    if tuple(old.shape) != tuple(tensor.shape):
        tensor = tensor.reshape(old.shape)
    if isinstance(module, QuantizedLinear) and parameter == "bias":
        module.bias = torch.nn.Parameter(tensor, requires_grad=False)
        return
    if isinstance(old, torch.nn.Parameter):
        setattr(module, parameter, torch.nn.Parameter(tensor, requires_grad=False))
    else:
        module.register_buffer(parameter, tensor)


def load_quantized(gguf: Path, header_dir: Path, attn_implementation: str | None = None) -> PreTrainedModel:
    """The model of ``gguf`` with its linear layers and embeddings kept in their block formats (float32 elsewhere),
    in eval mode on the CPU. Raises ModelLoadError naming the file for an architecture transformers cannot map."""
    from gguf import GGUFReader, dequantize
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    try:
        reader = GGUFReader(str(gguf))
    except Exception as exc:  # noqa: BLE001 (a damaged or cut-short file fails anywhere in the parser)
        raise ModelLoadError(f"cannot read the GGUF file {gguf} ({one_line(exc)}): it is damaged (cut short?) or no "
                             f"GGUF model; download it again") from exc
    config = AutoConfig.from_pretrained(str(header_dir))
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn_implementation)
    architecture = _architecture(reader)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    try:
        mapping = weights_map(model, processor, architecture, header_dir, get_gguf_hf_weights_map)
    except (NotImplementedError, KeyError, ValueError) as exc:
        raise ModelLoadError(f"{gguf}: transformers cannot map the tensors of GGUF architecture {architecture!r} "
                             f"({one_line(exc)})") from exc
    loaded: set[str] = set()
    widened: dict[str, list[str]] = {}
    for tensor in reader.tensors:
        code = int(tensor.tensor_type)
        rows = int(tensor.data.shape[0]) if tensor.data.ndim == 2 else 0
        if code in BLOCKS and rows:
            order, name = _row_order(processor, tensor.name, rows, mapping)
            hf_name = mapping.get(name)
            if hf_name is not None and order is not None and hf_name.endswith(".weight"):
                parent, attribute, _ = _module_of(model, hf_name)
                blocks = torch.from_numpy(np.ascontiguousarray(np.asarray(tensor.data)[order]))
                stand_in = _quantized_module(getattr(parent, attribute), blocks, code)
                if stand_in is not None:
                    setattr(parent, attribute, stand_in)
                    loaded.add(hf_name)
                    continue
        result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=mapping, parsed_parameters={})
        hf_name = mapping.get(result.name)
        if hf_name is None:
            continue
        if code not in FLOAT_TYPES:
            widened.setdefault(tensor.tensor_type.name, []).append(tensor.name)
        _set_float(model, hf_name, result.weights)
        loaded.add(hf_name)
    _tie_output(model, config, loaded, gguf)
    for kind, names in widened.items():
        print(f"lookahead: {gguf.name}: {len(names)} {kind} tensor(s) (first {names[0]}) widened to float32 "
              f"({_why_widened(kind)})", file=sys.stderr)
    model.generation_config = GenerationConfig.from_pretrained(str(header_dir))
    return model.eval()


def weights_map(model: Any, processor: Any, architecture: str, header_dir: Path, make: Any) -> dict[str, str]:
    """``make(model, processor)`` (transformers' ``get_gguf_hf_weights_map``: GGUF tensor name -> parameter
    name), kept in ``header_dir`` (WEIGHTS_MAP) beside the config it follows. transformers rebuilds gguf's
    name table for every submodule it recurses into (a few hundred times for a small model: about half of
    its load), the same table each time. The kept map is read back only where everything it follows is
    as it was: the transformers and gguf versions, the GGUF architecture, the processor's class and the
    model's parameter names; else it is made and kept again. A directory that cannot be written keeps
    nothing (the map is made at every load)."""
    stamp = {"transformers": version("transformers"), "gguf": version("gguf"), "architecture": architecture,
             "processor": type(processor).__qualname__, "names": list(model.state_dict())}
    path = header_dir / WEIGHTS_MAP
    try:
        kept = json.loads(path.read_text())
        if kept.get("stamp") == stamp and isinstance(kept.get("map"), dict) \
                and all(isinstance(k, str) and isinstance(v, str) for k, v in kept["map"].items()):
            return dict(kept["map"])
    except (OSError, ValueError, AttributeError):
        pass  # (none kept yet, or unreadable: made below)
    mapping = make(model, processor)
    partial = path.with_name(f"{WEIGHTS_MAP}.{os.getpid()}.partial")
    try:
        partial.write_text(json.dumps({"stamp": stamp, "map": mapping}))
        partial.replace(path)  # (whole or not at all, whichever process writes last)
    except OSError:
        partial.unlink(missing_ok=True)
    return mapping


def _tie_output(model: Any, config: Any, loaded: set[str], gguf: Path) -> None:
    """Give an output head the GGUF has no tensor for the embedding's weights (tied), and check that every
    parameter was read from the file."""
    missing = [name for name, _ in model.named_parameters() if name not in loaded]
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    head_names = [name for name in missing if name.endswith("weight") and model.get_submodule(name.rsplit(".", 1)[0])
                  is head]
    if head_names and getattr(config, "tie_word_embeddings", False):
        parent, attribute, _ = _module_of(model, head_names[0])
        if isinstance(embedding, QuantizedEmbedding) and embedding.blocks is not None and \
                isinstance(head, torch.nn.Linear):
            setattr(parent, attribute, QuantizedLinear(embedding.blocks, embedding.format_code, embedding.embedding_dim,
                                                       embedding.num_embeddings))
        else:
            head.weight = embedding.weight
        missing = [name for name in missing if name not in head_names]
    if head_names and not getattr(config, "tie_word_embeddings", False) and head_names[0] in missing:
        raise ModelLoadError(f"{gguf}: the GGUF file holds no output head ({head_names[0]}) and the config does not "
                             f"tie it to the embedding; the file is incomplete: download it again")
    missing = [name for name, p in model.named_parameters() if name in missing]
    if missing:
        raise ModelLoadError(f"{gguf}: the GGUF file holds no tensor for {len(missing)} parameter(s) of the model "
                             f"(first {missing[0]}); the file is incomplete or of another architecture")


FORMATS_READ = ", ".join(FORMAT_NAMES[code] for code in sorted(BLOCKS))


def _why_widened(kind: str) -> str:
    """Why tensors of GGML type ``kind`` were widened to float32."""
    if kind not in FORMAT_NAMES.values():
        return f"lookahead's kernel reads {FORMATS_READ}, not {kind}"
    return "their module is no linear layer or embedding the kernel stands in for, or transformers reorders them " \
           "beyond their rows"
