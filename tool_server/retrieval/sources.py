"""Upstream corpus layouts turned into one deduplicated list of :class:`Document`.

``load_corpus_sources(paths)`` reads each file in the layout it has (told from its
content, never its name) and merges them:

* our JSONL (``id``, ``title``, ``contents``): kept as is, ids included;
* a JSONL corpus without ``title`` whose ``contents`` start with a quoted title line
  (Search-R1's ``wiki-18.jsonl``: ``"\"Title\"\ntext"``): the title is split off;
* a passage corpus, JSON list or JSONL of ``{"title", "text"}`` (HippoRAG's
  ``2wikimultihopqa_corpus.json``);
* a title corpus, a JSON object ``{title: [sentence, ...] | text}`` (HippoRAG's
  ``hotpotqa_train_corpus.json``);
* HotpotQA question files, whose paragraphs become documents: the original layout
  (``context`` = ``[[title, [sentence, ...]], ...]``, JSON list or JSONL) and IRCoT's
  (``contexts`` = ``[{"title", "paragraph_text", ...}, ...]``, JSONL).

Texts are whitespace-normalised (sentences joined as written, runs of spaces folded).
Two documents with the same title and text are one document (the first seen is kept),
so the same paragraph from several files is indexed once. A document from an upstream
layout gets the id :func:`passage_id` (a hash of title and text), so a question's gold
paragraph maps to its corpus id without the corpus at hand.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from .corpus import CorpusError, Document, document_from_dict, read_corpus


def clean_text(text: str) -> str:
    """Runs of whitespace folded to one space, ends stripped."""
    return " ".join(str(text).split())


def paragraph_text(sentences: Any) -> str:
    """A paragraph from a list of sentences (joined as written: HotpotQA sentences carry
    their own leading spaces) or a string; whitespace-normalised."""
    if isinstance(sentences, (list, tuple)):
        return clean_text("".join(str(s) for s in sentences))
    return clean_text(sentences)


def passage_id(title: str, text: str) -> str:
    """The id of an upstream passage: the first 16 hex digits of
    ``sha256(clean(title) + "\\n" + clean(text))``."""
    key = clean_text(title) + "\n" + clean_text(text)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def passage(title: str, text: str) -> Document:
    title, text = clean_text(title), clean_text(text)
    return Document(id=passage_id(title, text), title=title, contents=text)


def json_records(path: str, error: type = CorpusError, whole_file: bool = True) -> list:
    """All records of a JSON file (one value; a list is its records) or a JSONL file (one
    value a line). ``whole_file=False`` reads JSONL only; a bad line raises ``error``
    naming the file and line."""
    if not os.path.isfile(path):
        raise error(f"{path!r} does not exist")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if whole_file:
        try:
            value = json.loads(text)
            return value if isinstance(value, list) else [value]
        except json.JSONDecodeError:
            pass
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise error(f"{path}:{lineno}: not valid JSON or JSONL ({e.msg})") from None
    return out


def _records(path: str) -> list:
    """All records of a corpus source file (JSON or JSONL)."""
    return json_records(path, CorpusError)


def hotpot_paragraphs(record: dict, where: str) -> list[tuple[str, str, bool]]:
    """``(title, text, is_gold)`` of every paragraph of one HotpotQA question, in either
    the original layout (gold: titles in ``supporting_facts``) or IRCoT's
    (gold: ``is_supporting``)."""
    if "contexts" in record:
        out = []
        for j, c in enumerate(record["contexts"]):
            if not isinstance(c, dict) or "title" not in c or "paragraph_text" not in c:
                raise CorpusError(f"{where}: contexts[{j}] needs 'title' and 'paragraph_text'")
            out.append(
                (c["title"], paragraph_text(c["paragraph_text"]), bool(c.get("is_supporting")))
            )
        return out
    context = record["context"]
    if isinstance(context, dict):  # the HF datasets layout: {"title": [], "sentences": []}
        context = list(zip(context.get("title", []), context.get("sentences", [])))
    facts = record.get("supporting_facts") or []
    if isinstance(facts, dict):
        gold = set(facts.get("title", []))
    else:
        gold = {f[0] for f in facts if isinstance(f, (list, tuple)) and f}
    out = []
    for j, pair in enumerate(context):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise CorpusError(f"{where}: context[{j}] must be [title, [sentence, ...]]")
        out.append((pair[0], paragraph_text(pair[1]), pair[0] in gold))
    return out


def _wiki18_title(contents: str) -> tuple[str, str]:
    """Search-R1's wiki-18 ``contents``: ``'"Title"\\ntext'`` -> (title, text)."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    return first.strip().strip('"'), rest


LAYOUTS = ("documents", "wiki18", "passages", "titles", "hotpotqa")


def detect_layout(first: Any, path: str) -> str:
    """The layout of a file from its first record (see the module doc)."""
    if not isinstance(first, dict):
        raise CorpusError(f"{path}: expected JSON objects, got {type(first).__name__}")
    keys = set(first)
    if "contexts" in keys or "context" in keys:
        return "hotpotqa"
    if "contents" in keys:
        contents = first["contents"]
        if (
            "title" not in keys
            and isinstance(contents, str)
            and contents.startswith('"')
            and '"\n' in contents
        ):
            return "wiki18"
        return "documents"
    if {"title", "text"} <= keys:
        return "passages"
    if first and all(isinstance(v, (list, str)) for v in first.values()):
        return "titles"
    raise CorpusError(
        f"{path}: unknown corpus layout (keys {sorted(keys)[:8]}); expected "
        "{'id','title','contents'}, {'title','text'}, a HotpotQA question with "
        "'context'/'contexts', or a JSON object {title: sentences}"
    )


def _first_jsonl_layout(path: str) -> str | None:
    """The layout of a JSONL file's first line (None if it is not one JSON object)."""
    if not os.path.isfile(path):
        raise CorpusError(f"corpus source {path!r} does not exist")
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    return detect_layout(json.loads(line), path)
                except (json.JSONDecodeError, CorpusError):
                    return None
    return None


def read_source(path: str) -> tuple[str, list[Document]]:
    """(layout, documents) of one corpus file (see the module doc)."""
    if path.endswith(".jsonl") and _first_jsonl_layout(path) == "documents":
        return "documents", list(read_corpus(path))  # streamed; errors name the line
    records = _records(path)
    if not records:
        return "documents", []
    layout = detect_layout(records[0], path)
    if layout == "documents":
        return layout, [document_from_dict(r, f"{path} record {i}") for i, r in enumerate(records)]
    if layout == "titles":
        if len(records) != 1:
            raise CorpusError(f"{path}: a title corpus is one JSON object {{title: sentences}}")
        return layout, [passage(t, paragraph_text(b)) for t, b in records[0].items()]
    docs: list[Document] = []
    for i, r in enumerate(records):
        where = f"{path} record {i}"
        if not isinstance(r, dict):
            raise CorpusError(f"{where}: expected a JSON object, got {type(r).__name__}")
        try:
            if layout == "hotpotqa":
                docs.extend(passage(t, x) for t, x, _ in hotpot_paragraphs(r, where))
            elif layout == "wiki18":
                docs.append(passage(*_wiki18_title(str(r["contents"]))))
            else:
                docs.append(passage(r["title"], r["text"]))
        except KeyError as e:
            raise CorpusError(
                f"{where}: missing field {e.args[0]!r} of the {layout} layout "
                f"(set by the file's first record)"
            ) from None
    return layout, docs


def merge_documents(docs: Iterable[Document]) -> tuple[list[Document], int]:
    """(documents with duplicates of (title, text) dropped, number dropped); two different
    documents with the same id are an error."""
    out: list[Document] = []
    seen_text: set[tuple[str, str]] = set()
    seen_id: dict[str, tuple[str, str]] = {}
    dropped = 0
    for d in docs:
        key = (clean_text(d.title), clean_text(d.contents))
        if key in seen_text:
            dropped += 1
            continue
        if d.id in seen_id:
            raise CorpusError(
                f"duplicate id {d.id!r} for two different documents "
                f"({seen_id[d.id][0]!r} and {d.title!r}); ids must be unique"
            )
        seen_text.add(key)
        seen_id[d.id] = key
        out.append(d)
    return out, dropped


def load_corpus_sources(paths: Sequence[str]) -> tuple[list[Document], dict]:
    """The combined, deduplicated corpus of ``paths`` and a summary
    ``{"sources": {path: {"layout", "documents"}}, "duplicates_dropped": n}``."""
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise CorpusError("no corpus files given; pass --corpus FILE [FILE ...]")
    read: list[Document] = []
    counts: dict[str, dict] = {}
    for p in paths:
        layout, docs = read_source(p)
        counts[p] = {"layout": layout, "documents": len(docs)}
        read.extend(docs)
    docs, dropped = merge_documents(read)
    if not docs:
        raise CorpusError(f"the corpus files {list(paths)} hold no documents")
    return docs, {"sources": counts, "duplicates_dropped": dropped}
