"""A small deterministic corpus written for tests and benchmarks (no dataset needed).

Twelve hand-written encyclopedia-style documents on distinct topics, followed by
generated documents about invented towns, each with a unique name, river, product and
founding year, so a query about one fact has exactly one right document.
"""

from __future__ import annotations

from .corpus import Document

TOPICS: list[tuple[str, str]] = [
    (
        "Photosynthesis",
        "Green plants capture light with chlorophyll and turn carbon dioxide "
        "and water into sugar, releasing oxygen as a by-product.",
    ),
    (
        "Volcano",
        "A volcano is an opening in the crust where molten rock, ash and gases "
        "escape from below the surface; eruptions can build tall cone-shaped mountains.",
    ),
    (
        "Chess",
        "Chess is a board game for two players on an eight by eight grid; each side "
        "commands sixteen pieces and tries to checkmate the opposing king.",
    ),
    (
        "Honey bee",
        "Honey bees live in colonies ruled by a single queen; worker bees gather "
        "nectar from flowers and store it as honey in wax combs.",
    ),
    (
        "Lighthouse",
        "A lighthouse is a tower with a bright lamp that guides ships at night "
        "and warns sailors of dangerous rocks near the coast.",
    ),
    (
        "Violin",
        "The violin is a wooden string instrument played with a bow; it has four "
        "strings tuned in fifths and the highest pitch of its family.",
    ),
    (
        "Glacier",
        "A glacier is a slow river of ice formed from compacted snow; moving "
        "glaciers carve valleys and leave piles of rock called moraines.",
    ),
    (
        "Bread",
        "Bread is baked from a dough of flour and water; yeast ferments the sugars "
        "and the gas it releases makes the loaf rise.",
    ),
    (
        "Compass",
        "A magnetic compass has a needle that aligns with the Earth's magnetic "
        "field and points north, helping travellers find their direction.",
    ),
    (
        "Tides",
        "Ocean tides are the regular rise and fall of sea level caused mostly by the "
        "gravitational pull of the Moon on the oceans.",
    ),
    (
        "Vaccination",
        "A vaccine trains the immune system to recognise a pathogen, so the "
        "body can fight the real infection quickly later.",
    ),
    (
        "Solar eclipse",
        "A solar eclipse happens when the Moon passes between the Sun and the "
        "Earth and blocks the sunlight for a few minutes.",
    ),
]

_SYLLABLES_A = [
    "Var",
    "Kel",
    "Dor",
    "Mal",
    "Tus",
    "Bre",
    "Ost",
    "Fen",
    "Gal",
    "Hir",
    "Lum",
    "Pra",
    "Quen",
    "Rav",
    "Sol",
    "Thal",
    "Ulm",
    "Wes",
    "Yar",
    "Zel",
]
_SYLLABLES_B = [
    "holt",
    "mora",
    "vik",
    "dane",
    "stead",
    "ford",
    "wick",
    "bury",
    "ness",
    "gard",
    "lin",
    "mouth",
    "rith",
    "tor",
    "well",
]
_PRODUCTS = [
    "copper kettles",
    "blue glass",
    "wool blankets",
    "clockwork toys",
    "smoked cheese",
    "paper lanterns",
    "silver bells",
    "cedar boats",
    "herbal tea",
    "leather boots",
    "stone bridges",
    "salt fish",
]


def town_name(i: int) -> str:
    return _SYLLABLES_A[i % len(_SYLLABLES_A)] + _SYLLABLES_B[(i * 7) % len(_SYLLABLES_B)]


def river_name(i: int) -> str:
    return (
        _SYLLABLES_B[(i * 3 + 1) % len(_SYLLABLES_B)].capitalize()
        + _SYLLABLES_A[(i * 11 + 5) % len(_SYLLABLES_A)].lower()
    )


def make_corpus(n: int = 50) -> list[Document]:
    """``n`` documents: the topics above first, then generated towns (ids ``doc-<i>``)."""
    docs = [Document(f"doc-{i}", t, c) for i, (t, c) in enumerate(TOPICS[:n])]
    for j in range(max(0, n - len(TOPICS))):
        i = len(docs)
        town = town_name(j)
        docs.append(
            Document(
                f"doc-{i}",
                town,
                f"{town} is a market town on the river {river_name(j)}, founded in the year "
                f"{1100 + 17 * j}. It is famous for its {_PRODUCTS[j % len(_PRODUCTS)]} and "
                f"holds a fair every {['spring', 'summer', 'autumn', 'winter'][j % 4]}.",
            )
        )
    return docs
