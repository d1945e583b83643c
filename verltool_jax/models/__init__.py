"""Flax NNX policies -- decoder-only (Qwen2, Qwen3, Llama) and vision-language (Qwen2.5-VL,
Qwen2-VL) -- and their HF interop."""
from .config import ModelConfig, RopeScaling, VisionConfig
from .hf_io import hf_named_tensors, load_hf, save_hf
from .logprobs import token_logprobs
from .transformer import Transformer
from .vision import ImageBatch
from .vision_language import VisionLanguageModel, vl_inputs

__all__ = ["ImageBatch", "ModelConfig", "RopeScaling", "Transformer", "VisionConfig",
           "VisionLanguageModel", "hf_named_tensors", "load_hf", "save_hf", "token_logprobs",
           "vl_inputs"]
