"""vtj-letter-count: an example verltool-jax plugin package.

How many times does a letter occur in a word? Language models that see tokens, not
letters, often miscount; a tool that counts makes the question easy. The package
provides, through entry points only (nothing in verltool-jax names it):

- the tool ``letter_count`` (:mod:`vtj_letter_count.tool`): ``<count>r in strawberry</count>``
  -> ``3``;
- the task ``letter_count`` (:mod:`vtj_letter_count.task`): generated questions in the
  verl layout, with SFT demonstrations that call the tool;
- the reward ``letter_count`` (:mod:`vtj_letter_count.reward`): 1 iff the last
  ``<answer>`` is the right count.

Train a tiny model on it: ``python -m verltool_jax.train --config
<site-packages>/vtj_letter_count/config.py:tiny``.
"""

TAG = "count"  # the tool's action tag: <count>LETTER in WORD</count>


def count_letter(letter: str, word: str) -> int:
    """How many times ``letter`` occurs in ``word``, ignoring case."""
    if len(letter) != 1:
        raise ValueError(f"letter must be one character, got {letter!r}")
    return word.lower().count(letter.lower())
