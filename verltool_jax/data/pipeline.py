"""Grain pipelines over validated rows, with checkpointable iterator state.

``RowPipeline(rows, transform, seed, shuffle, num_epochs)`` is
``grain.MapDataset.source(rows).shuffle(seed).repeat(num_epochs).map(transform)``
(a transform returning ``None`` drops the row, e.g. an over-long prompt). Its iterator
state is a JSON-serialisable dict; ``set_state`` on a fresh pipeline over the same rows
resumes exactly where ``get_state`` was taken. The state carries a fingerprint of the
rows and the shuffle settings, and restoring it onto different data is an error.

``PromptPipeline`` yields :class:`PromptExample` (chat-templated prompt ids plus the row);
``SFTPipeline`` yields :class:`verltool_jax.data.sft.SFTExample`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grain

from verltool_jax.data.images import multimodal_prompt
from verltool_jax.data.readers import read_files
from verltool_jax.data.rows import validate_sft_row
from verltool_jax.data.sft import ObservationIds, SFTExample, tokenize_sft_row
from verltool_jax.data.templating import prompt_token_ids


@dataclass
class PromptExample:
    """One prompt ready for rollout. ``index`` is the row's position in the data set."""

    index: int
    prompt_ids: list[int]
    row: dict = field(repr=False)
    images: list = field(default_factory=list, repr=False)  # ImageInput, placeholder order

    @property
    def data_source(self) -> str:
        return self.row["data_source"]

    @property
    def ground_truth(self) -> Any:
        return self.row["reward_model"]["ground_truth"]

    @property
    def messages(self) -> list[dict]:
        return self.row["prompt"]

    def to_prompt(self, group_id: str) -> dict:
        """The rollout's prompt form: ``{"prompt_ids", "data" (the row), "group_id"}``."""
        return {
            "prompt_ids": list(self.prompt_ids),
            "data": self.row,
            "group_id": group_id,
            "images": list(self.images),
        }


def rows_fingerprint(rows: Sequence[dict], sample: int = 1000) -> str:
    """sha1 of the row count and up to ``sample`` evenly spaced rows (cheap, stable)."""
    n = len(rows)
    step = max(1, n // sample)
    h = hashlib.sha1(str(n).encode())
    for i in range(0, n, step):
        h.update(json.dumps(rows[i], sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


class RowPipeline:
    """Deterministic, resumable iteration over ``transform(index, row)`` (see module doc)."""

    def __init__(
        self,
        rows: Sequence[dict],
        transform: Callable[[int, dict], Any],
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = None,
    ):
        if len(rows) == 0:
            raise ValueError("the data set is empty (no rows)")
        if num_epochs is not None and num_epochs < 1:
            raise ValueError(f"num_epochs must be >= 1 or None (forever), got {num_epochs}")
        self.rows = list(rows)
        self.seed, self.shuffle, self.num_epochs = int(seed), bool(shuffle), num_epochs
        self._fingerprint = rows_fingerprint(self.rows)
        ds = grain.MapDataset.range(len(self.rows))
        if self.shuffle:
            ds = ds.shuffle(seed=self.seed)
        ds = ds.repeat(num_epochs)
        ds = ds.map(self._counting(transform))
        ds = ds.filter(lambda x: x is not None)
        # No prefetch threads: the state then counts exactly the examples handed out.
        self._iter = iter(
            ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        )
        self.consumed = 0

    def _counting(self, transform: Callable[[int, dict], Any]) -> Callable[[Any], Any]:
        """``transform`` by row index, failing when it drops every row: 2n drops in a row
        (n rows) span a whole epoch, so no row passes and the iterator would spin forever."""
        n, dropped = len(self.rows), [0]

        def apply(i: Any) -> Any:
            x = transform(int(i), self.rows[int(i)])
            dropped[0] = dropped[0] + 1 if x is None else 0
            if dropped[0] >= 2 * n:
                raise ValueError(
                    f"every one of the {n} rows was dropped (e.g. each prompt is longer "
                    "than rollout.max_prompt_tokens): raise rollout.max_prompt_tokens or "
                    "shorten the prompts (e.g. task.system_prompt)"
                )
            return x

        return apply

    def __iter__(self):
        return self

    def __next__(self):
        x = next(self._iter)
        self.consumed += 1
        return x

    def next_batch(self, n: int) -> list:
        """Up to ``n`` examples (fewer only when a finite pipeline runs out)."""
        out = []
        for _ in range(n):
            try:
                out.append(next(self))
            except StopIteration:
                break
        return out

    def _meta(self) -> dict:
        return {
            "fingerprint": self._fingerprint,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_epochs": self.num_epochs,
            "num_rows": len(self.rows),
        }

    def get_state(self) -> dict:
        """JSON-serialisable position of the iterator (save it with the checkpoint)."""
        return {"grain": self._iter.get_state(), "consumed": self.consumed, **self._meta()}

    def set_state(self, state: dict) -> None:
        """Resume from ``get_state()``; ValueError if it was taken on other data/settings."""
        if not isinstance(state, dict) or "grain" not in state:
            raise ValueError(
                f"data iterator state must be a dict from get_state(), got {type(state).__name__}"
            )
        mine = self._meta()
        diff = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if diff:
            raise ValueError(
                "cannot resume the data iterator: the saved state was taken on "
                f"different data or settings (saved, now): {diff}"
            )
        self._iter.set_state(state["grain"])
        self.consumed = int(state.get("consumed", 0))


def _prompt_transform(
    tokenizer, max_prompt_tokens: int | None, overlong: str, image_processor=None, chat=None
):
    def transform(index: int, row: dict) -> PromptExample | None:
        images: list = []  # ImageInput, one per <image> marker
        if chat is not None:  # native tool calls: the template with the tools' schemas
            if row.get("images"):
                raise ValueError(
                    f"row {index} has images, which rollout.tool_format={chat.fmt!r} does "
                    "not take yet; use rollout.tool_format='tags'"
                )
            ids = chat.render(tokenizer, row["prompt"])[1]
        elif row.get("images"):
            ids, images = multimodal_prompt(
                tokenizer, row["prompt"], list(row["images"]), image_processor, f"row {index}"
            )
        else:
            ids = prompt_token_ids(tokenizer, row["prompt"])
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            if overlong == "drop":
                return None
            raise ValueError(
                f"row {index}: the prompt has {len(ids)} tokens, more than "
                f"max_prompt_tokens={max_prompt_tokens}; raise "
                "rollout.max_prompt_tokens or shorten the prompt"
            )
        return PromptExample(index=index, prompt_ids=ids, row=row, images=images)

    return transform


class PromptPipeline(RowPipeline):
    """Chat-templated prompts. ``overlong``: "drop" (skip) or "error" for long prompts.
    Rows with ``images`` (``data/images.py``) need ``image_processor`` (a vision-language
    policy's ``ImageProcessor``). ``chat`` (``chat.render.ToolChat``, native tool calls:
    ``rollout.tool_chat()``) renders each prompt with the tools' schemas."""

    def __init__(
        self,
        rows: Sequence[dict],
        tokenizer,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = None,
        max_prompt_tokens: int | None = None,
        overlong: str = "drop",
        image_processor=None,
        chat=None,
    ):
        if overlong not in ("drop", "error"):
            raise ValueError(f"overlong must be 'drop' or 'error', got {overlong!r}")
        self._transform = _prompt_transform(
            tokenizer, max_prompt_tokens, overlong, image_processor, chat
        )
        super().__init__(rows, self._transform, seed=seed, shuffle=shuffle, num_epochs=num_epochs)

    def example_at(self, index: int) -> PromptExample | None:
        """The example of row ``index`` (e.g. to replay prompts in flight at a checkpoint);
        None if that row's prompt is over ``max_prompt_tokens`` (with overlong="drop")."""
        if not 0 <= index < len(self.rows):
            raise IndexError(f"row index {index} out of range (0..{len(self.rows) - 1})")
        return self._transform(int(index), self.rows[int(index)])

    @classmethod
    def from_files(
        cls, paths: Sequence[str | os.PathLike], tokenizer, fmt: str = "auto", **kwargs
    ) -> PromptPipeline:
        """Read (and validate) parquet/JSONL files, then build the pipeline."""
        return cls(read_files(paths, fmt), tokenizer, **kwargs)


class SFTPipeline(RowPipeline):
    """Tokenized demonstrations (rows with ``response_segments``), see ``data/sft.py``."""

    def __init__(
        self,
        rows: Sequence[dict],
        tokenizer,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = None,
        append_eos: bool = True,
        observation_ids: ObservationIds | None = None,
    ):
        def transform(index: int, row: dict) -> SFTExample:
            return tokenize_sft_row(
                tokenizer, row, index=index, append_eos=append_eos, observation_ids=observation_ids
            )

        super().__init__(rows, transform, seed=seed, shuffle=shuffle, num_epochs=num_epochs)

    @classmethod
    def from_files(
        cls, paths: Sequence[str | os.PathLike], tokenizer, fmt: str = "auto", **kwargs
    ) -> SFTPipeline:
        return cls(read_files(paths, fmt, validate=validate_sft_row), tokenizer, **kwargs)
