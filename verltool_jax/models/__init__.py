"""Flax NNX decoder-only policies (Qwen2, Qwen3, Llama), their HF interop and GGUF import."""
from .config import ModelConfig, RopeScaling
from .gguf_io import export_gguf_to_hf, gguf_tokenizer, load_gguf
from .hf_io import hf_named_tensors, load_hf, save_hf
from .logprobs import token_logprobs
from .transformer import Transformer

__all__ = ["ModelConfig", "RopeScaling", "Transformer", "export_gguf_to_hf", "gguf_tokenizer",
           "hf_named_tensors", "load_gguf", "load_hf", "save_hf", "token_logprobs"]
