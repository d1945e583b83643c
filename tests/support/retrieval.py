"""A retrieval index of the synthetic corpus (:mod:`tool_server.retrieval.synthetic`),
built once per process, for the tests of the search tools and the retrieval service."""

from __future__ import annotations

from tool_server.retrieval.synthetic import make_corpus

_built: dict[tuple[str, int], str] = {}


def synthetic_index(kind: str, n: int = 50, root: str | None = None) -> str:
    """Build (once per process) an index of ``make_corpus(n)`` and return its folder.

    ``root`` defaults to a temporary folder removed at exit.
    """
    import atexit
    import os
    import shutil
    import tempfile

    from tool_server.retrieval.corpus import write_corpus
    from tool_server.retrieval.index import build_index

    key = (kind, n)
    if key not in _built:
        if root is None:
            root = tempfile.mkdtemp(prefix="verltool_synth_idx_")
            atexit.register(shutil.rmtree, root, True)
        corpus = os.path.join(root, f"corpus_{n}.jsonl")
        if not os.path.exists(corpus):
            write_corpus(corpus, make_corpus(n))
        out = os.path.join(root, f"{kind}_{n}")
        build_index(corpus, out, kind)
        _built[key] = out
    return _built[key]
