"""Flax NNX policies -- decoder-only (Qwen2, Qwen3, Llama) and vision-language (Qwen2.5-VL,
Qwen2-VL) -- their HF interop and GGUF import."""

from .config import ModelConfig, RopeScaling, VisionConfig
from .gguf_io import export_gguf_to_hf, gguf_tokenizer, load_gguf
from .hf_io import hf_named_tensors, load_hf, save_hf
from .logprobs import token_logprobs
from .transformer import Transformer
from .vision import ImageBatch
from .vision_language import VisionLanguageModel, vl_inputs

__all__ = [
    "ImageBatch",
    "ModelConfig",
    "RopeScaling",
    "Transformer",
    "VisionConfig",
    "VisionLanguageModel",
    "export_gguf_to_hf",
    "gguf_tokenizer",
    "hf_named_tensors",
    "load_gguf",
    "load_hf",
    "save_hf",
    "token_logprobs",
    "vl_inputs",
]
