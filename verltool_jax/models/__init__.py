"""Flax NNX decoder-only policies (Qwen2, Qwen3, Llama) and their HF interop."""
from .config import ModelConfig, RopeScaling
from .transformer import Transformer

__all__ = ["ModelConfig", "RopeScaling", "Transformer"]
