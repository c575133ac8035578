"""WebShop's purchase reward.

    score = r_type * (attribute matches + option matches + [price <= limit]) / (#attributes + #options + 1)

- attribute match: a goal attribute whose fuzzy token-set ratio with one of the product's attributes
  is above 85, or that occurs verbatim in the lower-cased title, the joined bullets or the description;
- option match: a goal option whose fuzzy token-set ratio with one chosen option value is above 85,
  both sides colour-normalised first (`normalize.normalize_color`);
- type factor r_type: 1.0, but 0.5 when neither the query is the same, nor the breadcrumbs share two
  levels, nor more than 20% of the goal title's nouns occur in the purchased title; 0.1 when under 10%
  of those nouns occur, and 0.0 when none does (these two apply whatever the query and breadcrumbs say).

One deliberate difference: WebShop finds a title's nouns with spaCy's English tagger, a model that
cannot be downloaded here. `title_nouns` keeps the words a tagger would call nouns in a product title
(everything except numbers, function words and a list of common title adjectives and adverbs), so
title_score can differ from WebShop's on real titles while the thresholds behave the same on
WebShop's own test cases (see tests/envs/test_webshop_reward.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from swerl.envs.webshop.data import Goal, Product
from swerl.envs.webshop.normalize import fuzzy_match, normalize_color, normalize_named_option

_WORD = re.compile(r"[a-z0-9]+(?:[.'][a-z0-9]+)*")
_NUMBER = re.compile(r"[\d.]+")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_FUNCTION_WORDS = _words("""
a an the and or nor but for with without of in on at to from by into onto over under up down off out as
per via than then so yet if about above across after against along among around before behind below beneath
beside between beyond during except inside near outside since through throughout toward towards upon within
this that these those it its it's is are was were be been being am do does did has have had will would can
could should may might must shall i me my we our you your he him his she her they them their who whom which
what whose all any both each every few more most other some such no not only own same too very s t just
also plus x
""")
# Words spaCy tags as adjectives or adverbs when they modify a product noun in a title.
_MODIFIERS = _words("""
new best great good high low top ultra super extra premium professional original classic modern vintage casual
formal natural organic soft hard light heavy small large big mini little long short wide narrow thin thick
slim
deep full half double single multi portable compact adjustable waterproof wireless cordless rechargeable
durable comfortable breathable lightweight heavy-duty stainless non anti daily everyday quick fast slow easy
fresh dry wet hot cold warm cool sweet spicy gluten free sugar-free unscented scented pure raw whole real
cute pretty beautiful elegant stylish fashionable fashion soft-touch waterproofed sturdy solid round square
flat smooth shiny matte glossy clear transparent black white red blue green yellow pink purple grey gray brown
beige navy orange silver gold golden dark bright local outdoor indoor electric digital smart automatic manual
universal compatible available extra-large mens womens unisex kids
""")
_ADJ_SUFFIXES = ("able", "ible", "ous", "ful", "less", "ive", "ish")


def title_nouns(title: str) -> list[str]:
    """The title's words that count as nouns for the type reward, lower-cased, repeats kept."""
    out = []
    for w in _WORD.findall(title.lower()):
        if _NUMBER.fullmatch(w) or w in _FUNCTION_WORDS or w in _MODIFIERS:
            continue
        if len(w) > 5 and w.endswith(_ADJ_SUFFIXES):
            continue
        out.append(w)
    return out


@dataclass(frozen=True)
class TypeReward:
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float


@dataclass(frozen=True)
class RewardBreakdown:
    """The score of a purchase and every component WebShop reports for it."""

    score: float
    """The total, 0..1."""
    r_type: float
    """The type factor (1, 0.5, 0.1 or 0)."""
    query_match: bool
    category_match: bool
    title_score: float
    """Fraction of the goal title's nouns found in the purchased title."""
    r_att: float
    """Fraction of goal attributes matched."""
    num_attr_matches: int
    r_option: float | None
    """Fraction of goal options matched (None when the goal has no options)."""
    num_option_matches: int
    r_price: bool
    """The price is within the goal's limit."""
    w_att: float
    w_option: float
    w_price: float

    def items(self) -> tuple[tuple[str, float], ...]:
        """The components as (name, value) pairs, booleans as 0/1, in a fixed order (for GameObs.info)."""
        pairs: list[tuple[str, float]] = [
            ("score", self.score), ("r_type", self.r_type), ("r_att", self.r_att), ("w_att", self.w_att),
            ("num_attr_matches", float(self.num_attr_matches)),
        ]
        if self.r_option is not None:
            pairs += [("r_option", self.r_option), ("w_option", self.w_option)]
        pairs += [("num_option_matches", float(self.num_option_matches)), ("r_price", float(self.r_price)),
                  ("w_price", self.w_price), ("query_match", float(self.query_match)),
                  ("category_match", float(self.category_match)), ("title_score", self.title_score)]
        return tuple(pairs)


def _levels(breadcrumb: str) -> set[str]:
    return {x.strip() for x in breadcrumb.split("›")}


def type_reward(product: Product | Mapping[str, str], goal: Goal | Mapping[str, str]) -> TypeReward:
    """Whether the purchase is the same kind of product as the goal's."""
    p_query, p_cat, p_name = _fields(product)
    g_query, g_cat, g_name = _fields(goal)
    query_match = p_query == g_query
    category_match = len(_levels(p_cat) & _levels(g_cat)) >= 2
    wanted = title_nouns(g_name)
    got = set(title_nouns(p_name))
    title_score = 0.2 if not wanted else len(got & set(wanted)) / len(wanted)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeReward(r_type=r_type, query_match=query_match, category_match=category_match,
                      title_score=title_score)


def _fields(x: Product | Goal | Mapping[str, str]) -> tuple[str, str, str]:
    if isinstance(x, Mapping):
        return x["query"], x["product_category"], x["name"]
    return x.query, x.product_category, x.name


def attribute_matches(product: Product, goal_attributes: Sequence[str]) -> int:
    """How many goal attributes the product has."""
    title = product.name.lower()
    bullets = " ".join(product.bullet_points).lower()
    description = product.description.lower()
    n = 0
    for g in goal_attributes:
        # the goal attribute itself is not lower-cased for the substring test (WebShop's rule)
        if (any(fuzzy_match(p, g) for p in product.attributes) or g in title or g in bullets
            or g in description):
            n += 1
    return n


def option_matches(chosen: Sequence[str], goal_options: Sequence[tuple[str | None, str]]) -> int:
    """How many goal options are among the chosen option values."""
    picked = [normalize_color(o) for o in chosen]
    wanted = [normalize_color(v) if n is None else normalize_named_option(n, v) for n, v in goal_options]
    return sum(1 for g in wanted if any(fuzzy_match(p, g) for p in picked))


def purchase_reward(product: Product, goal: Goal, price: float,
                    options: Mapping[str, str]) -> RewardBreakdown:
    """WebShop's `get_reward` for buying `product` at `price` with the chosen `options` (name -> value)."""
    t = type_reward(product, goal)
    r_price = price <= goal.price_upper
    n_att = attribute_matches(product, goal.attributes)
    n_opt = option_matches(list(options.values()), goal.goal_options)
    denom = len(goal.attributes) + len(goal.goal_options) + 1
    score = (n_att + n_opt + int(r_price)) / denom * t.r_type
    return RewardBreakdown(
        score=score, r_type=t.r_type, query_match=t.query_match, category_match=t.category_match,
        title_score=t.title_score, r_att=n_att / len(goal.attributes), num_attr_matches=n_att,
        r_option=n_opt / len(goal.goal_options) if goal.goal_options else None, num_option_matches=n_opt,
        r_price=r_price, w_att=len(goal.attributes) / denom, w_option=len(goal.goal_options) / denom,
        w_price=1 / denom)
