"""Text normalisation the WebShop reward relies on: the colour vocabulary used to normalise option
values, and the fuzzy token-set score (`thefuzz` semantics on top of rapidfuzz).

WebShop maps an option value to the first word of its colour list that occurs in it as a substring
(so "navy blue" becomes "blue", the list being alphabetical), and leaves other values as they are.
Its fuzzy matches use `thefuzz.fuzz.token_set_ratio`, which lower-cases, drops characters 128-255,
turns other punctuation into spaces and rounds the score to an integer before comparing it with a
threshold; `fuzzy_score` reproduces that with rapidfuzz.
"""

from __future__ import annotations

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

# WebShop's colour vocabulary, in its order (the order decides which colour wins for "navy blue").
COLORS: tuple[str, ...] = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure",
    "banana", "beige", "black", "blue", "blush", "bordeaux", "bronze",
    "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark",
    "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite",
    "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac",
    "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)

FUZZY_THRESHOLD = 85
"""A fuzzy match needs a (rounded) token-set ratio strictly above this."""

# thefuzz's `asciionly` deletes exactly the code points 128..255 (not every non-ASCII character).
_LATIN1 = {i: None for i in range(128, 256)}


def normalize_color(value: str) -> str:
    """The first colour of `COLORS` that is a substring of `value`, else `value` unchanged."""
    for color in COLORS:
        if color in value:
            return color
    return value


def normalize_named_option(name: str, value: str) -> str:
    """A goal option given as a (name, value) pair, as WebShop's synthetic goals hold them.

    WebShop passes the pair itself to the colour normaliser (which then only recognises a colour
    equal to the whole name or value) and to thefuzz (which scores the pair's `str()`, i.e. the
    tokens of both name and value); this is that behaviour on plain strings."""
    for color in COLORS:
        if color in (name, value):
            return color
    return f"{name} {value}"


def fuzzy_score(a: str, b: str) -> int:
    """`thefuzz.fuzz.token_set_ratio(a, b)`: 0..100, an integer."""
    pa = default_process(a.translate(_LATIN1))
    pb = default_process(b.translate(_LATIN1))
    if not pa or not pb:
        return 0
    return round(fuzz.token_set_ratio(pa, pb))


def fuzzy_match(a: str, b: str) -> bool:
    """Whether WebShop counts `a` and `b` as the same attribute or option."""
    return fuzzy_score(a, b) > FUZZY_THRESHOLD
