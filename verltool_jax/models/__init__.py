"""Flax NNX decoder-only policies (Qwen2, Qwen3, Llama) and their HF interop."""
from .config import ModelConfig, RopeScaling
from .hf_io import hf_named_tensors, load_hf, save_hf
from .logprobs import token_logprobs
from .transformer import Transformer

__all__ = ["ModelConfig", "RopeScaling", "Transformer", "hf_named_tensors", "load_hf",
           "save_hf", "token_logprobs"]
