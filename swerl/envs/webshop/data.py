"""The WebShop catalog: products and goals, loaded from files in WebShop's own schema.

A catalog directory holds:

- `items_shuffle*.json`: the products, a JSON list in the scraped schema WebShop ships (`asin`,
  `name`, `category`, `query`, `product_category`, `full_description`, `small_description`,
  `pricing` as text such as "$12.99" or "$10.99 - $15.99", `images`, `customization_options`
  {name: [{"value", "image"}]}, plus scraped fields WebShop drops);
- `items_ins_v2*.json`: {asin: {"attributes", "instruction", "instruction_attributes"}}, the product
  attributes the reward matches against (and WebShop's synthetic instructions);
- `items_human_ins.json` (optional): {asin: [{"instruction", "instruction_attributes",
  "instruction_options"}]}, the human-written goals;
- `reviews.json` (optional): [{"asin", "reviews": [{"title", "stars"|"score", "review"|"body"}],
  "average_rating"}];
- `goals.json` (optional, written by swerl's generator): the goals materialised with their price
  limit and split, so that every run sees the same goals.

Without `goals.json` the goals are built as WebShop builds them (human goals when
`items_human_ins.json` exists, else synthetic goals with one goal per option combination): the
price of a product with a price range is drawn uniformly in the range, the goal's price limit is
the larger of two of the four next multiples of ten above the price, the goals are shuffled with
seed 233, and WebShop's index ranges give the splits (test: 0-499, eval: 500-1499, train: the
rest). Draws come from a seeded generator, so a directory always yields the same goals.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path
from typing import Any

PRICE_STEPS: tuple[float, ...] = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_LIMIT = 1_000_000.0
"""The price limit of a goal whose product's price has fewer than two steps above it (WebShop's)."""
GOAL_SHUFFLE_SEED = 233
SPLIT_RANGES: dict[str, tuple[int, int | None]] = {"test": (0, 500), "eval": (500, 1500),
                                                   "train": (1500, None)}
"""WebShop's goal index ranges (after the shuffle) for catalogs without a goals.json."""
DEFAULT_PRICE = 100.0
"""The price WebShop gives a product without pricing."""


class CatalogError(ValueError):
    """A catalog file is missing, unreadable or has a malformed record."""


@dataclass(frozen=True)
class OptionGroup:
    """One customisation of a product (e.g. size) and its values, lower-cased as WebShop shows them."""

    name: str
    """The option's name, lower-cased (`color`, `size`, ...)."""
    values: tuple[str, ...]
    """The values offered, in the catalog's order."""


@dataclass(frozen=True)
class Review:
    """One customer review, as the Reviews page shows it."""

    title: str
    """The review's headline."""
    score: int
    """Stars, 1..5."""
    body: str
    """The review text."""


@dataclass(frozen=True)
class Product:
    """A product as the environment uses it (WebShop's `load_products` fields)."""

    asin: str
    """The product id shown on the results page and clicked to open the item page."""
    name: str
    """The product title (`Title`)."""
    category: str
    """Top-level category (beauty, food, fashion, furniture, electronics)."""
    query: str
    """The search query the product was scraped under, lower-cased; part of the type reward."""
    product_category: str
    """The breadcrumb, levels joined with ` › `; part of the type reward."""
    description: str
    """The full description (the Description page)."""
    bullet_points: tuple[str, ...]
    """The feature bullets (the Features page)."""
    pricing: tuple[float, ...]
    """One price, or the low and high end of a price range."""
    price: float
    """The price the purchase is charged (a range's price is drawn once, when the catalog loads)."""
    options: tuple[OptionGroup, ...] = ()
    """The customisations, in the catalog's order."""
    attributes: tuple[str, ...] = ("DUMMY_ATTR",)
    """The attributes the attribute reward matches goal attributes against."""
    reviews: tuple[Review, ...] = ()
    """Customer reviews (the Reviews page)."""
    rating: str = "N.A."
    """The average rating as shown on the item page."""
    image: str = ""
    """The main image URL (not shown in text mode)."""

    @property
    def price_tag(self) -> str:
        """The price as WebShop prints it: `$12.99`, or `$10.99 to $15.99` for a range."""
        if len(self.pricing) == 1:
            return f"${self.pricing[0]}"
        return f"${self.pricing[0]} to ${self.pricing[1]}"

    def option_names(self) -> dict[str, str]:
        """value -> option name for every option value (a value in two groups belongs to the later one,
        as on WebShop's page, where the later radio button with that value wins)."""
        return {v: g.name for g in self.options for v in g.values}


@dataclass(frozen=True)
class Goal:
    """What the shopper is asked to buy (WebShop's goal dict)."""

    goal_id: str
    """Stable id; `TextGame.reset` takes it."""
    asin: str
    """The product the goal was written for (any product that matches scores the same)."""
    instruction_text: str
    """The instruction shown on every page, price clause included."""
    attributes: tuple[str, ...]
    """Attributes the purchase must have (matched fuzzily or as substrings of title / bullets /
    description)."""
    goal_options: tuple[tuple[str | None, str], ...]
    """(option name, value) pairs the purchase must have chosen; the name is None for human goals,
    which list values only."""
    price_upper: float
    """The price limit (NO_PRICE_LIMIT when there is none)."""
    query: str
    """The goal product's query (type reward)."""
    category: str
    """The goal product's category."""
    product_category: str
    """The goal product's breadcrumb (type reward)."""
    name: str
    """The goal product's title (type reward: noun overlap with the purchased title)."""
    split: str = "train"
    """Which split the goal belongs to (`train`, `test`, `eval`, ...)."""
    weight: float = 1.0
    """WebShop's sampling weight."""

    def __post_init__(self) -> None:
        if not self.attributes:
            raise CatalogError(f"goal {self.goal_id}: a goal needs at least one attribute (WebShop skips "
                               "those without); add instruction_attributes")
        if self.price_upper <= 0:
            raise CatalogError(f"goal {self.goal_id}: price_upper must be > 0, got {self.price_upper}")

    def to_json(self) -> dict[str, Any]:
        """The goal in goals.json form (options as a dict when named, else a list, as WebShop has them)."""
        named = all(n is not None for n, _ in self.goal_options) and self.goal_options
        options: Any = {n: v for n, v in self.goal_options} if named else [v for _, v in self.goal_options]
        return {"goal_id": self.goal_id, "asin": self.asin, "split": self.split,
                "instruction_text": self.instruction_text, "attributes": list(self.attributes),
                "goal_options": options, "price_upper": self.price_upper, "query": self.query,
                "category": self.category, "product_category": self.product_category, "name": self.name,
                "weight": self.weight}


@dataclass(frozen=True)
class Catalog:
    """Products and goals of one catalog directory."""

    products: tuple[Product, ...]
    """Every product, in file order (duplicate and malformed asins dropped, as WebShop does)."""
    goals: tuple[Goal, ...]
    """Every goal, in index order."""
    source: str = ""
    """Where the catalog was loaded from."""
    by_asin: Mapping[str, Product] = field(default_factory=dict, compare=False, repr=False)
    goals_by_id: Mapping[str, Goal] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_asin", {p.asin: p for p in self.products})
        object.__setattr__(self, "goals_by_id", {g.goal_id: g for g in self.goals})
        if len(self.goals_by_id) != len(self.goals):
            raise CatalogError(f"{self.source}: duplicate goal ids")
        missing = [g.goal_id for g in self.goals if g.asin not in self.by_asin]
        if missing:
            raise CatalogError(f"{self.source}: goals {missing[:5]} name products that are not in the "
                               "catalog")

    def goal_ids(self, split: str | None = None) -> list[str]:
        """Goal ids of one split (all goals when None), in index order."""
        ids = [g.goal_id for g in self.goals if split is None or g.split == split]
        if split is not None and not ids:
            have = sorted({g.split for g in self.goals})
            raise CatalogError(f"{self.source}: no goals in split {split!r}; splits here: {have}")
        return ids

    def goal(self, goal_id: str) -> Goal:
        try:
            return self.goals_by_id[goal_id]
        except KeyError:
            raise CatalogError(f"{self.source}: unknown goal id {goal_id!r} ({len(self.goals)} goals, e.g. "
                               f"{self.goals[0].goal_id if self.goals else 'none'})") from None


# ---- parsing the original files -----------------------------------------------------------------

def parse_pricing(text: Any) -> tuple[float, ...]:
    """WebShop's price parsing: the numbers after each `$` (the first two of a range); none -> 100.0."""
    if not text:
        return (DEFAULT_PRICE,)
    if not isinstance(text, str):
        raise CatalogError(f"pricing must be text like '$12.99', got {type(text).__name__}")
    prices = []
    for part in text.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            prices.append(float(Decimal(digits)))
        except InvalidOperation:
            raise CatalogError(f"pricing {text!r}: cannot read a price from {part!r}") from None
    if not prices:
        return (DEFAULT_PRICE,)
    return tuple(prices[:2])


def _str(rec: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    v = rec.get(key, default)
    if v is None:
        raise CatalogError(f"{where}: missing field {key!r}")
    if not isinstance(v, str):
        raise CatalogError(f"{where}: field {key!r} must be text, got {type(v).__name__}")
    return v


def _options(raw: Any, where: str) -> tuple[OptionGroup, ...]:
    if not raw:
        return ()
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: customization_options must be an object of name -> list of values")
    groups = []
    for name, contents in raw.items():
        if contents is None:
            continue
        values = []
        for c in contents:
            value = c.get("value") if isinstance(c, dict) else c
            if not isinstance(value, str):
                raise CatalogError(f"{where}: option {name!r} has a value that is not text: {value!r}")
            # WebShop lower-cases values and shows "/" as " | "
            values.append(value.strip().replace("/", " | ").lower())
        groups.append(OptionGroup(name=str(name).lower(), values=tuple(values)))
    return tuple(groups)


def _reviews(raw: Any, where: str) -> tuple[Review, ...]:
    out = []
    for r in raw or ():
        if not isinstance(r, dict):
            raise CatalogError(f"{where}: a review must be an object, got {type(r).__name__}")
        score = r.get("score", r.get("stars", 0))
        try:
            score = int(float(score))
        except (TypeError, ValueError):
            raise CatalogError(f"{where}: review score {score!r} is not a number") from None
        out.append(Review(title=str(r.get("title", "")), score=score,
                          body=str(r.get("body", r.get("review", "")))))
    return tuple(out)


def parse_product(rec: Any, attrs: Mapping[str, Any], reviews: Mapping[str, Any], rng: random.Random, *,
                  index: int = 0, origin: str = "products") -> Product | None:
    """One record of items_shuffle*.json (None for the records WebShop skips: asin 'nan' or longer than
    10)."""
    where = f"{origin} record {index}"
    if not isinstance(rec, dict):
        raise CatalogError(f"{where}: expected an object, got {type(rec).__name__}")
    asin = _str(rec, "asin", where)
    where = f"{where} ({asin})"
    if asin == "nan" or len(asin) > 10:
        return None
    bullets = rec.get("small_description", "")
    bullets = [bullets] if isinstance(bullets, str) else list(bullets or [])
    pricing = parse_pricing(rec.get("pricing"))
    # A price range is charged one price drawn in it, once per load, as WebShop's product_prices do.
    price = pricing[0] if len(pricing) == 1 else rng.uniform(pricing[0], pricing[1])
    a = attrs.get(asin)
    attributes = tuple(a["attributes"]) if isinstance(a, dict) and a.get("attributes") else ("DUMMY_ATTR",)
    rv = reviews.get(asin, {})
    images = rec.get("images") or [""]
    rating = rv.get("average_rating", "N.A.") if isinstance(rv, dict) else "N.A."
    return Product(
        asin=asin, name=_str(rec, "name", where), category=_str(rec, "category", where),
        query=_str(rec, "query", where).lower().strip(),
        product_category=_str(rec, "product_category", where),
        description=_str(rec, "full_description", where, ""), bullet_points=tuple(str(b) for b in bullets),
        pricing=pricing, price=price, options=_options(rec.get("customization_options"), where),
        attributes=attributes, reviews=_reviews(rv.get("reviews") if isinstance(rv, dict) else (), where),
        rating=str(rating), image=str(images[0]))


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CatalogError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise CatalogError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def _find(directory: Path, pattern: str, required: bool) -> Path | None:
    hits = sorted(directory.glob(pattern))
    if not hits:
        if required:
            raise CatalogError(f"{directory}: no {pattern} file; a WebShop catalog directory needs the "
                               "products (items_shuffle*.json) and their attributes (items_ins_v2*.json), "
                               "e.g. from `swerl tasks webshop --out DIR`")
        return None
    if len(hits) > 1:
        raise CatalogError(f"{directory}: several {pattern} files ({', '.join(h.name for h in hits)}); keep "
                           "one per directory")
    return hits[0]


def price_limit(price: float, rng: random.Random) -> float:
    """WebShop's goal price limit for a product of this price: the larger of two of the (up to) four
    next multiples of ten above it; NO_PRICE_LIMIT when fewer than two are left."""
    steps = [p for p in PRICE_STEPS if p > price][:4]
    if len(steps) < 2:
        return NO_PRICE_LIMIT
    return sorted(rng.sample(steps, 2))[1]


def price_clause(limit: float) -> str:
    return f", and price lower than {limit:.2f} dollars" if limit != NO_PRICE_LIMIT else ""


def _human_goals(products: Sequence[Product], human: Mapping[str, Any], rng: random.Random) -> list[dict]:
    goals = []
    for p in products:
        for ins in human.get(p.asin, ()) or ():
            if not ins.get("instruction_attributes"):
                continue  # WebShop skips human goals without attributes
            limit = price_limit(p.price, rng)
            goals.append(dict(asin=p.asin,
                              instruction_text=str(ins["instruction"]).strip(".") + price_clause(limit),
                              attributes=tuple(ins["instruction_attributes"]),
                              goal_options=tuple((None, str(v))
                                                 for v in ins.get("instruction_options") or ()),
                              price_upper=limit, weight=1.0))
    return goals


def _synthetic_goals(products: Sequence[Product], attrs: Mapping[str, Any], rng: random.Random) -> list[dict]:
    goals: list[dict] = []
    counts: dict[str, int] = defaultdict(int)
    for p in products:
        a = attrs.get(p.asin) or {}
        text = a.get("instruction")
        if not text:
            continue
        ins_attrs = tuple(a.get("instruction_attributes") or ())
        limit = price_limit(p.price, rng)
        groups = sorted(p.options, key=lambda g: g.name)
        for combo in itertools.product(*(g.values for g in groups)):
            named = tuple((g.name, v) for g, v in zip(groups, combo, strict=True))
            opt_text = ", and ".join(f"{n}: {v}" for n, v in named)
            goals.append(dict(asin=p.asin, instruction_text=f"{text}{' with ' + opt_text if opt_text else ''}"
                                                            f"{price_clause(limit)}",
                              attributes=ins_attrs, goal_options=named, price_upper=limit))
            for att in ins_attrs:
                counts[att] += 1
    for g in goals:
        g["weight"] = (sum(1.0 / counts[a] for a in g["attributes"]) / len(g["attributes"])
                       if g["attributes"] else 0.0)
    return [g for g in goals if g["attributes"]]


def _split_of(index: int) -> str:
    for name, (lo, hi) in SPLIT_RANGES.items():
        if index >= lo and (hi is None or index < hi):
            return name
    return "train"


def parse_goal(rec: Any, products: Mapping[str, Product], *, index: int = 0, origin: str = "goals") -> Goal:
    """One record of goals.json."""
    where = f"{origin} record {index}"
    if not isinstance(rec, dict):
        raise CatalogError(f"{where}: expected an object, got {type(rec).__name__}")
    asin = _str(rec, "asin", where)
    product = products.get(asin)
    if product is None:
        raise CatalogError(f"{where}: asin {asin!r} is not in the catalog")
    raw = rec.get("goal_options") or []
    if isinstance(raw, dict):
        options = tuple((str(k), str(v)) for k, v in raw.items())
    elif isinstance(raw, list):
        options = tuple((None, str(v)) for v in raw)
    else:
        raise CatalogError(f"{where}: goal_options must be a list of values or an object of name -> value")
    attributes = rec.get("attributes")
    if not isinstance(attributes, list) or not all(isinstance(a, str) for a in attributes):
        raise CatalogError(f"{where}: attributes must be a list of text")
    try:
        price_upper = float(rec.get("price_upper", NO_PRICE_LIMIT))
    except (TypeError, ValueError):
        raise CatalogError(f"{where}: price_upper must be a number") from None
    return Goal(goal_id=_str(rec, "goal_id", where, str(index)), asin=asin,
                instruction_text=_str(rec, "instruction_text", where), attributes=tuple(attributes),
                goal_options=options, price_upper=price_upper,
                query=_str(rec, "query", where, product.query),
                category=_str(rec, "category", where, product.category),
                product_category=_str(rec, "product_category", where, product.product_category),
                name=_str(rec, "name", where, product.name), split=_str(rec, "split", where, "train"),
                weight=float(rec.get("weight", 1.0)))


def load_catalog(directory: str | Path, *, human_goals: bool | None = None, seed: int = 0) -> Catalog:
    """Load a catalog directory (see the module docstring).

    human_goals: build goals from items_human_ins.json (True) or from items_ins_v2's synthetic
    instructions (False); None: human goals when that file exists. Ignored when goals.json exists.
    seed: seeds the price draws for ranges and the goals' price limits."""
    d = Path(directory)
    if not d.is_dir():
        raise CatalogError(f"{d}: not a directory; pass a WebShop catalog directory (e.g. tasks/webshop)")
    items_path = _find(d, "items_shuffle*.json", required=True)
    attrs_path = _find(d, "items_ins_v2*.json", required=True)
    assert items_path is not None and attrs_path is not None
    human_path = _find(d, "items_human_ins*.json", required=False)
    reviews_path = _find(d, "reviews*.json", required=False)
    goals_path = d / "goals.json"

    raw_items = _read_json(items_path)
    if not isinstance(raw_items, list):
        raise CatalogError(f"{items_path}: expected a JSON list of products")
    attrs = _read_json(attrs_path)
    if not isinstance(attrs, dict):
        raise CatalogError(f"{attrs_path}: expected an object of asin -> attributes")
    reviews: dict[str, Any] = {}
    if reviews_path is not None:
        raw_reviews = _read_json(reviews_path)
        if not isinstance(raw_reviews, list):
            raise CatalogError(f"{reviews_path}: expected a JSON list of {{asin, reviews, average_rating}}")
        reviews = {r["asin"]: r for r in raw_reviews if isinstance(r, dict) and "asin" in r}

    rng = random.Random(seed)
    products: list[Product] = []
    seen: set[str] = set()
    for i, rec in enumerate(raw_items):
        p = parse_product(rec, attrs, reviews, rng, index=i, origin=items_path.name)
        if p is None or p.asin in seen:
            continue
        seen.add(p.asin)
        products.append(p)
    by_asin = {p.asin: p for p in products}

    if goals_path.is_file():
        raw_goals = _read_json(goals_path)
        if not isinstance(raw_goals, list):
            raise CatalogError(f"{goals_path}: expected a JSON list of goals")
        goals = [parse_goal(g, by_asin, index=i, origin=goals_path.name) for i, g in enumerate(raw_goals)]
        return Catalog(products=tuple(products), goals=tuple(goals), source=str(d))

    use_human = human_path is not None if human_goals is None else human_goals
    if use_human:
        if human_path is None:
            raise CatalogError(f"{d}: human_goals=True but there is no items_human_ins.json")
        human = _read_json(human_path)
        if not isinstance(human, dict):
            raise CatalogError(f"{human_path}: expected an object of asin -> list of instructions")
        specs = _human_goals(products, human, rng)
    else:
        specs = _synthetic_goals(products, attrs, rng)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(specs)
    goals = []
    for i, s in enumerate(specs):
        p = by_asin[s["asin"]]
        goals.append(Goal(goal_id=str(i), split=_split_of(i), query=p.query, category=p.category,
                          product_category=p.product_category, name=p.name, **s))
    return Catalog(products=tuple(products), goals=tuple(goals), source=str(d))


@lru_cache(maxsize=8)
def _cached(directory: str, mtimes: tuple[float, ...], human_goals: bool | None, seed: int) -> Catalog:
    return load_catalog(directory, human_goals=human_goals, seed=seed)


def cached_catalog(directory: str | Path, *, human_goals: bool | None = None, seed: int = 0) -> Catalog:
    """`load_catalog`, shared by every game of this process that reads the same unchanged directory
    (a catalog is immutable, so concurrent episodes can share it)."""
    d = Path(directory).resolve()
    mtimes = tuple(p.stat().st_mtime for p in sorted(d.glob("*.json"))) if d.is_dir() else ()
    return _cached(str(d), mtimes, human_goals, seed)
