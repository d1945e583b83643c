"""Retrieval over a local JSONL corpus: BM25 (bm25s) and dense (FAISS + sentence
embeddings) indexes saved to disk and memory-mapped, served with request batching.

Build: ``python -m tool_server.retrieval build --corpus FILES --out idx/ --kind bm25|dense``
(corpus files in the layouts of :mod:`.sources`; ``--questions`` prints recall@k).
Use: ``get_service(idx).search(query, k)`` (async) or ``.search_batch(queries, k)``.
"""

from .corpus import CorpusError, Document, read_corpus, write_corpus
from .index import RetrievalIndexError, build_index, check_index, read_meta
from .questions import Question, QuestionError, read_questions
from .service import Hit, RetrievalService, get_service
from .sources import load_corpus_sources

__all__ = [
    "CorpusError",
    "Document",
    "read_corpus",
    "write_corpus",
    "RetrievalIndexError",
    "build_index",
    "read_meta",
    "Hit",
    "RetrievalService",
    "get_service",
    "check_index",
    "Question",
    "QuestionError",
    "read_questions",
    "load_corpus_sources",
]
