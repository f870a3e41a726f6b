"""Turn a CTranslate2 Whisper model (faster-whisper's `model.bin`) into an openai-whisper model, with no download.

The CTranslate2 file is parsed directly (the layout `ctranslate2.specs.model_spec.ModelSpec._serialize` writes):
uint32 binary version, spec name and revision, then each variable as name, rank, uint32 dims, dtype id, byte count and
raw little-endian bytes, then aliases (name → name of the variable it shares, e.g. the output projection tied to the
token embeddings). Quantized weights (int8 with per-row `weight_scale`, int16 with a scalar scale) are dequantized,
float16/bfloat16 widened; fused attention projections are split into openai-whisper's query/key/value Linears.

The result is cached as a regular openai-whisper checkpoint (`{"dims", "model_state_dict"}`, plus the model's
`alignment_heads`), named by the SHA-256 of `model.bin`, so `whisper.load_model(path)` could read it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import whisper
from whisper.model import ModelDimensions, Whisper

CACHE_ENV = "INSITU_WHISPER_CACHE"
# Order of CTranslate2's DataType enum (include/ctranslate2/types.h): float32, int8, int16, int32, float16, bfloat16.
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}
_ITEM_SIZE_DTYPES = {4: np.float32, 2: np.int16, 1: np.int8}  # binary versions < 4 stored only the item size
_SIZES = {(4, 384): "tiny", (6, 512): "base", (12, 768): "small", (24, 1024): "medium", (32, 1280): "large"}
_ENGLISH_VOCAB = 51864  # the .en models; multilingual ones have 51865 (51866 for large-v3)
_FORMAT_VERSION = 1  # bump when the mapping below changes, so stale cached checkpoints are not reused


def default_cache_dir() -> Path:
    """Where converted checkpoints go: $INSITU_WHISPER_CACHE, else ~/.cache/insitu-whisper."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "insitu-whisper"


def read_ct2_variables(model_bin: str | os.PathLike[str]) -> tuple[str, int, dict[str, np.ndarray]]:
    """Parse a CTranslate2 `model.bin`: (spec name, spec revision, variables with aliases resolved)."""
    return _parse_ct2(Path(model_bin), load=True)  # type: ignore[return-value]


def read_ct2_shapes(model_bin: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """The shape of every variable in a CTranslate2 `model.bin`, skipping the data (cheap even for large models)."""
    return _parse_ct2(Path(model_bin), load=False)[2]  # type: ignore[return-value]


def _parse_ct2(model_bin: Path, *, load: bool) -> tuple[str, int, dict[str, np.ndarray] | dict[str, tuple[int, ...]]]:
    with model_bin.open("rb") as file:
        size = model_bin.stat().st_size

        def take(fmt: str) -> int:
            raw = file.read(struct.calcsize("<" + fmt))
            if len(raw) < struct.calcsize("<" + fmt):
                raise ValueError(f"{model_bin}: truncated CTranslate2 model file")
            return struct.unpack("<" + fmt, raw)[0]

        def take_string() -> str:
            return file.read(take("H"))[:-1].decode("utf-8")  # the length counts the trailing NUL

        version = take("I")
        if not 1 <= version <= 6:
            raise ValueError(f"{model_bin}: unsupported CTranslate2 binary version {version} (this reader knows 1-6)")
        name, revision = (take_string(), take("I")) if version >= 2 else ("", 1)
        variables: dict = {}
        for _ in range(take("I")):
            var_name = take_string()
            shape = tuple(take("I") for _ in range(take("B")))
            if version >= 4:
                type_id, num_bytes = take("B"), take("I")
                if type_id not in _DTYPES:
                    raise ValueError(f"{model_bin}: variable {var_name} has unknown dtype id {type_id}")
                dtype = _DTYPES[type_id]
            else:
                item_size = take("B")
                dtype, num_bytes = _ITEM_SIZE_DTYPES[item_size], take("I") * item_size
            if not load:
                file.seek(num_bytes, os.SEEK_CUR)
                variables[var_name] = shape
                continue
            raw = file.read(num_bytes)
            if len(raw) != num_bytes:
                raise ValueError(f"{model_bin}: truncated CTranslate2 model file (in {var_name})")
            if dtype == "bfloat16":  # the high half of a float32
                array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
            variables[var_name] = array.reshape(shape)
        if version >= 3:
            for _ in range(take("I")):
                alias, target = take_string(), take_string()
                variables[alias] = variables[target]
        if file.tell() != size:
            raise ValueError(f"{model_bin}: {size - file.tell()} trailing bytes after the variables; is it intact?")
    return name, revision, variables


def dequantize(variables: dict[str, np.ndarray], name: str) -> np.ndarray:
    """Variable `name` as float32, undoing CTranslate2's quantization (value = stored / scale) when it has a scale."""
    value = variables[name]
    scale = variables.get(f"{name}_scale")
    if f"{name}_zero" in variables:
        raise ValueError(f"{name} is AWQ-quantized (has a zero point); convert from an unquantized model instead")
    if scale is None:
        if value.dtype.kind != "f":
            raise ValueError(f"{name} is {value.dtype} without a scale; cannot dequantize")
        return value.astype(np.float32)
    scale = scale.astype(np.float32)
    if scale.ndim == 0:  # int16: one scale for the whole matrix
        return value.astype(np.float32) / scale
    rows = value.reshape(value.shape[0], -1).astype(np.float32) / scale[:, None]  # int8: one scale per output row
    return rows.reshape(value.shape)


def ct2_to_openai(variables: dict[str, np.ndarray]) -> tuple[ModelDimensions, dict[str, torch.Tensor]]:
    """Map CTranslate2 WhisperSpec variables onto openai-whisper's `Whisper` parameter names and shapes."""
    _check_layout(variables)

    def f(name: str) -> np.ndarray:
        return dequantize(variables, name)

    state: dict[str, np.ndarray] = {}

    def linear(dst: str, src: str) -> None:
        state[f"{dst}.weight"] = f(f"{src}/weight")
        state[f"{dst}.bias"] = f(f"{src}/bias")

    def layer_norm(dst: str, src: str) -> None:
        state[f"{dst}.weight"] = f(f"{src}/gamma")
        state[f"{dst}.bias"] = f(f"{src}/beta")

    def attention(dst: str, fused: list[tuple[str, list[str]]], out: str, ln_dst: str, ln_src: str) -> None:
        # CTranslate2 fuses projections along the output rows: self-attention [q; k; v], cross-attention q, [k; v].
        # openai-whisper's key has no bias: CTranslate2 stores zeros there, and a key bias would only add a constant
        # per query to the attention logits, which softmax ignores, so dropping it is exact either way.
        for src, parts in fused:
            weights = np.split(f(f"{src}/weight"), len(parts))
            biases = np.split(f(f"{src}/bias"), len(parts))
            for part, weight, bias in zip(parts, weights, biases, strict=True):
                state[f"{dst}.{part}.weight"] = weight
                if part != "key":
                    state[f"{dst}.{part}.bias"] = bias
        linear(f"{dst}.out", out)
        layer_norm(ln_dst, ln_src)

    def mlp(dst: str, src: str) -> None:
        linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
        layer_norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")

    n_audio_layer, n_text_layer = _count_layers(variables, "encoder"), _count_layers(variables, "decoder")
    linear("encoder.conv1", "encoder/conv1")
    linear("encoder.conv2", "encoder/conv2")
    state["encoder.positional_embedding"] = f("encoder/position_encodings/encodings")
    for i in range(n_audio_layer):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        sa = f"{src}/self_attention"
        attention(f"{dst}.attn", [(f"{sa}/linear_0", ["query", "key", "value"])], f"{sa}/linear_1",
                  f"{dst}.attn_ln", f"{sa}/layer_norm")  # fmt: skip
        mlp(dst, src)
    layer_norm("encoder.ln_post", "encoder/layer_norm")

    state["decoder.token_embedding.weight"] = f("decoder/embeddings/weight")
    state["decoder.positional_embedding"] = f("decoder/position_encodings/encodings")
    for i in range(n_text_layer):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        sa, ca = f"{src}/self_attention", f"{src}/attention"
        attention(f"{dst}.attn", [(f"{sa}/linear_0", ["query", "key", "value"])], f"{sa}/linear_1",
                  f"{dst}.attn_ln", f"{sa}/layer_norm")  # fmt: skip
        attention(f"{dst}.cross_attn", [(f"{ca}/linear_0", ["query"]), (f"{ca}/linear_1", ["key", "value"])],
                  f"{ca}/linear_2", f"{dst}.cross_attn_ln", f"{ca}/layer_norm")  # fmt: skip
        mlp(dst, src)
    layer_norm("decoder.ln", "decoder/layer_norm")

    conv1 = state["encoder.conv1.weight"]
    audio_pos, text_pos = state["encoder.positional_embedding"], state["decoder.positional_embedding"]
    dims = ModelDimensions(
        n_mels=conv1.shape[1],
        n_audio_ctx=audio_pos.shape[0],
        n_audio_state=audio_pos.shape[1],
        n_audio_head=int(variables["encoder/num_heads"]),
        n_audio_layer=n_audio_layer,
        n_vocab=state["decoder.token_embedding.weight"].shape[0],
        n_text_ctx=text_pos.shape[0],
        n_text_state=text_pos.shape[1],
        n_text_head=int(variables["decoder/num_heads"]),
        n_text_layer=n_text_layer,
    )
    return dims, {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in state.items()}


def convert(model_dir: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Convert `model_dir/model.bin` once and return the cached openai-whisper checkpoint (`<sha256>.pt`)."""
    model_bin = Path(model_dir) / "model.bin"
    if not model_bin.is_file():
        raise ValueError(f"{model_dir} is not a CTranslate2 model directory: no model.bin in it")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / f"ct2-whisper-{_sha256(model_bin)[:32]}-v{_FORMAT_VERSION}.pt"
    if target.is_file():
        return target
    name, _revision, variables = read_ct2_variables(model_bin)
    if name not in ("WhisperSpec", ""):
        raise ValueError(f"{model_bin} holds a {name}, not a Whisper model")
    dims, state = ct2_to_openai(variables)
    checkpoint = {
        "dims": asdict(dims),
        "model_state_dict": state,
        "alignment_heads": _alignment_heads(Path(model_dir), dims),
        "source": str(model_bin),
    }
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".pt.tmp")
    os.close(fd)
    try:
        torch.save(checkpoint, tmp)
        os.replace(tmp, target)  # atomic: a concurrent worker sees either no file or a whole one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_checkpoint(path: str | os.PathLike[str], device: str = "cpu") -> Whisper:
    """Build an fp32 openai-whisper model from a checkpoint (a converted one or openai's own `.pt`), offline."""
    checkpoint = torch.load(path, map_location=device, weights_only=True)
    dims = ModelDimensions(**checkpoint["dims"])
    model = Whisper(dims)
    model.load_state_dict(checkpoint["model_state_dict"])
    heads = checkpoint.get("alignment_heads")
    if heads:
        mask = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
        for layer, head in heads:
            mask[layer, head] = True
        model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    elif (name := _openai_checkpoint_name(Path(path))) is not None:
        model.set_alignment_heads(whisper._ALIGNMENT_HEADS[name])  # openai's heads are keyed by model name
    return model.float().eval().to(device)


def load_converted(
    model_dir: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None, device: str = "cpu"
) -> Whisper:
    """The openai-whisper equivalent of a CTranslate2 Whisper directory, converting on first use."""
    return load_checkpoint(convert(model_dir, cache_dir), device=device)


def describe(n_mels: int, n_audio_layer: int, n_audio_state: int, n_text_layer: int, n_vocab: int) -> str:
    """Whisper's name for a model of these dimensions (tiny.en, small, large-v3-turbo, ...), to label transcripts."""
    size = _SIZES.get((n_audio_layer, n_audio_state), f"{n_audio_layer}x{n_audio_state}")
    if size == "large":
        size += "-v3" if n_mels == 128 else "-v2"
        size += "-turbo" if n_text_layer == 4 else ""
    return size + (".en" if n_vocab == _ENGLISH_VOCAB else "")


def describe_dims(dims: ModelDimensions) -> str:
    """`describe` for an openai-whisper model's dimensions."""
    return describe(dims.n_mels, dims.n_audio_layer, dims.n_audio_state, dims.n_text_layer, dims.n_vocab)


def describe_ct2(model_dir: str | os.PathLike[str]) -> str:
    """`describe` for a CTranslate2 Whisper directory, from the variables' shapes alone."""
    shapes = read_ct2_shapes(Path(model_dir) / "model.bin")
    n_mels, n_state = shapes["encoder/conv1/weight"][1], shapes["encoder/conv1/weight"][0]
    n_vocab = shapes["decoder/embeddings/weight"][0]
    return describe(n_mels, _count_layers(shapes, "encoder"), n_state, _count_layers(shapes, "decoder"), n_vocab)


def _check_layout(variables: dict[str, np.ndarray]) -> None:
    """Refuse models whose CTranslate2 options openai-whisper's architecture cannot express."""
    expect = {"decoder/pre_norm": True, "decoder/scale_embeddings": False, "decoder/alibi": False}
    for key, wanted in expect.items():
        if key in variables and bool(variables[key]) != wanted:
            raise ValueError(f"unsupported Whisper variant: {key} is {bool(variables[key])}")
    projection = variables.get("decoder/projection/weight")
    if projection is not None and projection is not variables["decoder/embeddings/weight"]:
        if not np.array_equal(projection, variables["decoder/embeddings/weight"]):
            raise ValueError("the output projection is not tied to the token embeddings; openai-whisper requires it")
    if "decoder/projection/bias" in variables:
        raise ValueError("the output projection has a bias; openai-whisper has none")


def _count_layers(variables: dict[str, Any], side: str) -> int:
    pattern = re.compile(rf"^{side}/layer_(\d+)/")
    indices = {int(m.group(1)) for key in variables if (m := pattern.match(key))}
    if not indices or indices != set(range(len(indices))):
        raise ValueError(f"no contiguous {side} layers in the model (found {sorted(indices)})")
    return len(indices)


def _alignment_heads(model_dir: Path, dims: ModelDimensions) -> list[list[int]]:
    """The cross-attention heads used for word timestamps, from config.json; else the decoder's last half, all heads."""
    config = model_dir / "config.json"
    heads = json.loads(config.read_text()).get("alignment_heads") if config.is_file() else None
    if not heads:
        first = dims.n_text_layer // 2
        heads = [[layer, head] for layer in range(first, dims.n_text_layer) for head in range(dims.n_text_head)]
    return [[int(layer), int(head)] for layer, head in heads]


def _openai_checkpoint_name(path: Path) -> str | None:
    """openai-whisper's name for one of its released checkpoints: their download URLs carry the file's SHA-256."""
    digest = _sha256(path)
    return next((name for name, url in whisper._MODELS.items() if f"/{digest}/" in url), None)


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
