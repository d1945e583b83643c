"""Spider's hardness level (easy / medium / hard / extra) of a gold SQL query.

Spider's evaluation (``evaluation.py``, ``Evaluator.eval_hardness``) parses the query and
counts three things on its outermost SELECT:

* ``component1`` = [WHERE] + [GROUP BY] + [ORDER BY] + [LIMIT] + (tables in FROM - 1)
  + number of ``OR`` among the FROM-ON / WHERE / HAVING conditions
  + number of ``LIKE`` conditions among them;
* ``component2`` = number of nested queries: a subquery used as a value of a FROM-ON /
  WHERE / HAVING condition (each side counts), plus one for INTERSECT, one for UNION, one
  for EXCEPT (a chain ``a UNION b UNION c`` nests once at this level);
* ``others`` = [more than one aggregation] + [more than one SELECT item]
  + [more than one WHERE condition] + [more than one GROUP BY item], where the
  aggregation count adds aggregated SELECT items, aggregated GROUP BY items, aggregate
  calls in ORDER BY items, and, as Spider's ``count_agg`` does on its parse lists,
  WHERE conditions with ``NOT`` and the HAVING list's ``NOT`` conditions and
  ``AND``/``OR`` connectors (a quirk of the original we keep, so the levels match).

Then::

    easy   if c1 <= 1 and others == 0 and c2 == 0
    medium if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0)
    hard   if (others > 2 and c1 <= 2 and c2 == 0) or (2 < c1 <= 3 and others <= 2 and c2 == 0)
              or (c1 <= 1 and others == 0 and c2 <= 1)
    extra  otherwise

We do not use Spider's schema-resolving parser: a tokenizer-level counter
(:mod:`verltool_jax.rewards.sql_tokens`) splits the clauses at parenthesis depth 0, so it
needs no schema. Where it may differ from Spider: an aggregate nested inside an
arithmetic SELECT item (``a + max(b)``) is not counted as an aggregated item (Spider
keeps one aggregate per item, outside the arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass

from verltool_jax.rewards.sql_tokens import Token, is_kw, tokenize

LEVELS = ("easy", "medium", "hard", "extra")
AGGREGATES = ("max", "min", "count", "sum", "avg")
_CLAUSES = ("select", "from", "where", "group", "having", "order", "limit")
_COMPOUND = ("intersect", "union", "except")


@dataclass(frozen=True)
class HardnessCounts:
    component1: int
    component2: int
    others: int


def _depths(toks: list[Token]) -> list[int]:
    """The parenthesis depth at each token (an opening paren has the outer depth)."""
    out, d = [], 0
    for t in toks:
        if t == ("op", ")"):
            d -= 1
        out.append(d)
        if t == ("op", "("):
            d += 1
    return out


def _split(toks: list[Token], is_sep) -> list[list[Token]]:
    parts, cur = [], []
    for t, d in zip(toks, _depths(toks)):
        if d == 0 and is_sep(t):
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    parts.append(cur)
    return [p for p in parts if p]


def _clauses(toks: list[Token]) -> dict[str, list[Token]]:
    """Depth-0 clause bodies of one SELECT (keys: select, from, where, group, having,
    order, limit)."""
    out: dict[str, list[Token]] = {}
    cur = None
    depths = _depths(toks)
    k = 0
    while k < len(toks):
        t = toks[k]
        if depths[k] == 0 and is_kw(t, *_CLAUSES):
            cur = t[1].lower()
            out[cur] = []
            if cur in ("group", "order") and k + 1 < len(toks) and is_kw(toks[k + 1], "by"):
                k += 1
        elif cur is not None:
            out[cur].append(t)
        k += 1
    return out


@dataclass(frozen=True)
class _Cond:
    negated: bool
    like: bool
    nested: int


def _conditions(toks: list[Token]) -> tuple[list[_Cond], list[str]]:
    """Split a condition list at depth-0 AND/OR (an AND closing ``BETWEEN x AND y`` is
    part of the condition) -> (conditions, connectors)."""
    conds, conns, cur = [], [], []
    depths = _depths(toks)
    in_between = False
    for t, d in zip(toks, depths):
        if d == 0 and is_kw(t, "between"):
            in_between = True
        if d == 0 and is_kw(t, "and", "or"):
            if is_kw(t, "and") and in_between:
                in_between = False
                cur.append(t)
                continue
            conds.append(cur)
            conns.append(t[1].lower())
            cur = []
            continue
        cur.append(t)
    conds.append(cur)
    return [_cond(c) for c in conds if c], conns


def _cond(toks: list[Token]) -> _Cond:
    depths = _depths(toks)
    negated = any(d == 0 and is_kw(t, "not") for t, d in zip(toks, depths))
    like = any(d == 0 and is_kw(t, "like") for t, d in zip(toks, depths))
    nested = sum(
        1
        for k, (t, d) in enumerate(zip(toks, depths))
        if d == 0 and t == ("op", "(") and k + 1 < len(toks) and is_kw(toks[k + 1], "select")
    )
    return _Cond(negated, like, nested)


def _starts_with_agg(item: list[Token]) -> bool:
    toks = [t for t in item if not is_kw(t, "distinct")]
    return len(toks) >= 2 and is_kw(toks[0], *AGGREGATES) and toks[1] == ("op", "(")


def _agg_calls(item: list[Token]) -> int:
    depths = _depths(item)
    return sum(
        1
        for k, (t, d) in enumerate(zip(item, depths))
        if d == 0 and is_kw(t, *AGGREGATES) and k + 1 < len(item) and item[k + 1] == ("op", "(")
    )


def _from_parts(toks: list[Token]) -> tuple[int, list[_Cond], list[str]]:
    """(number of table units, ON conditions, their connectors) of a FROM clause."""
    units = _split(toks, lambda t: is_kw(t, "join") or t == ("op", ","))
    conds: list[_Cond] = []
    conns: list[str] = []
    for unit in units:
        depths = _depths(unit)
        on = next(
            (k for k, (t, d) in enumerate(zip(unit, depths)) if d == 0 and is_kw(t, "on")), None
        )
        if on is None:
            continue
        c, n = _conditions(unit[on + 1 :])
        if conds and c:
            conns.append("and")
        conds += c
        conns += n
    return len(units), conds, conns


def hardness_counts(sql: str) -> HardnessCounts:
    """Spider's three counts for ``sql`` (definitions in the module doc)."""
    toks = [t for t in tokenize(sql) if t != ("op", ";")]
    depths = _depths(toks)
    cut = next(
        (k for k, (t, d) in enumerate(zip(toks, depths)) if d == 0 and is_kw(t, *_COMPOUND)), None
    )
    compound = 0
    if cut is not None:
        compound = 1
        toks = toks[:cut]
    # a query wrapped in parentheses: look inside
    while len(toks) >= 2 and toks[0] == ("op", "(") and toks[-1] == ("op", ")"):
        toks = toks[1:-1]
    cl = _clauses(toks)
    select = _split(cl.get("select", []), lambda t: t == ("op", ","))
    n_tables, on_conds, on_conns = _from_parts(cl.get("from", []))
    where, where_conns = _conditions(cl.get("where", []))
    having, having_conns = _conditions(cl.get("having", []))
    group = _split(cl.get("group", []), lambda t: t == ("op", ","))
    order = _split(cl.get("order", []), lambda t: t == ("op", ","))

    conds = on_conds + where + having
    c1 = (
        bool(where)
        + bool(group)
        + bool(order)
        + ("limit" in cl)
        + max(n_tables - 1, 0)
        + (on_conns + where_conns + having_conns).count("or")
        + sum(c.like for c in conds)
    )
    c2 = sum(c.nested for c in conds) + compound
    aggs = (
        sum(_starts_with_agg(s) for s in select)
        + sum(c.negated for c in where)
        + sum(_starts_with_agg(g) for g in group)
        + sum(min(_agg_calls(o), 2) for o in order)
        + sum(c.negated for c in having)
        + len(having_conns)
    )
    others = (aggs > 1) + (len(select) > 1) + (len(where) > 1) + (len(group) > 1)
    return HardnessCounts(int(c1), int(c2), int(others))


def level_from_counts(c: HardnessCounts) -> str:
    """The level for the three counts (rules in the module doc)."""
    c1, c2, o = c.component1, c.component2, c.others
    if c1 <= 1 and o == 0 and c2 == 0:
        return "easy"
    if (o <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and o < 2 and c2 == 0):
        return "medium"
    if (
        (o > 2 and c1 <= 2 and c2 == 0)
        or (2 < c1 <= 3 and o <= 2 and c2 == 0)
        or (c1 <= 1 and o == 0 and c2 <= 1)
    ):
        return "hard"
    return "extra"


def hardness(sql: str) -> str:
    """Spider's hardness level of ``sql``: easy | medium | hard | extra."""
    return level_from_counts(hardness_counts(sql))
