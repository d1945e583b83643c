"""Data: the verl/VerlTool row layout, parquet/JSONL readers, grain pipelines, SFT demos."""

from verltool_jax.data.pipeline import (
    PromptExample,
    PromptPipeline,
    RowPipeline,
    SFTPipeline,
    rows_fingerprint,
)
from verltool_jax.data.readers import read_files, read_rows, write_rows
from verltool_jax.data.rows import DataRowError, ground_truth, validate_row, validate_sft_row
from verltool_jax.data.sft import SFTExample, tokenize_segments, tokenize_sft_row
from verltool_jax.data.templating import prompt_token_ids, render_prompt

__all__ = [
    "DataRowError",
    "PromptExample",
    "PromptPipeline",
    "RowPipeline",
    "SFTExample",
    "SFTPipeline",
    "ground_truth",
    "prompt_token_ids",
    "read_files",
    "read_rows",
    "render_prompt",
    "rows_fingerprint",
    "tokenize_segments",
    "tokenize_sft_row",
    "validate_row",
    "validate_sft_row",
    "write_rows",
]
