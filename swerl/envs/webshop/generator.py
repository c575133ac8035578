"""A seeded generator of WebShop catalogs in WebShop's own file schema.

WebShop's scraped catalog cannot be downloaded here, so `generate_catalog` writes one: products in
WebShop's five categories (beauty, food, fashion, furniture, electronics), several product types
each, every product with a brand, 3-5 attributes from its type's pool, 1-2 option groups with values
that WebShop's reward tells apart, a price, feature bullets, a description and reviews; and one
human-style goal per product (instruction, attributes, options, price limit), split into train and
held-out test goals. Products of one type share words, attributes and option values, so a goal's
product has close distractors in search results and in the reward.

Files written (see `data.py`): items_shuffle.json, items_ins_v2.json, items_human_ins.json,
reviews.json and goals.json. The same seed gives the same bytes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.envs.webshop.data import load_catalog, price_clause, price_limit
from swerl.envs.webshop.normalize import fuzzy_match, normalize_color
from swerl.envs.webshop.reward import purchase_reward


@dataclass(frozen=True)
class ProductType:
    """One kind of product (WebShop's `query`) and what its products may have."""

    query: str
    breadcrumb: str
    nouns: tuple[str, ...]
    """Title nouns, e.g. ("Shampoo", "Daily Shampoo"); the first is what goals ask for."""
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]
    suffixes: tuple[str, ...] = ("",)
    """Title endings, e.g. " for Men"."""


@dataclass(frozen=True)
class Category:
    name: str
    brands: tuple[str, ...]
    types: tuple[ProductType, ...]


_COLORS = ("black", "white", "navy", "grey", "olive", "red", "pink", "beige", "brown", "green", "purple",
           "yellow", "burgundy", "teal", "khaki")
_SIZES = ("small", "medium", "large", "3x-large")

CATEGORIES: tuple[Category, ...] = (
    Category("beauty", ("Lumeva", "Herbalis", "Purely North", "Cloud Nine", "Velora", "Auralie", "Sunpetal",
                        "Moss & Mint"), (
        ProductType("shampoo", "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
                    ("Shampoo", "Hair Shampoo", "Daily Shampoo"),
                    ("sulfate free", "paraben free", "tea tree", "argan oil", "dry hair",
                     "color treated hair", "natural ingredients", "cruelty free", "hair growth",
                     "dandruff control"),
                    (("size", ("8 fl oz", "16.9 fl oz", "33.8 fl oz", "travel size", "refill pouch")),
                     ("scent", ("lavender", "coconut", "citrus", "eucalyptus", "unscented", "rosemary"))),
                    (7, 38), ("", " for Women", " for Men")),
        ProductType("face moisturizer", "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
                    ("Face Moisturizer", "Facial Cream", "Moisturizing Cream"),
                    ("hyaluronic acid", "fragrance free", "sensitive skin", "spf 30", "anti aging",
                     "oil free", "vitamin c", "dermatologist tested", "non comedogenic", "shea butter"),
                    (("size", ("1.7 ounce", "2.5 ounce", "3.4 ounce", "jar", "pump bottle")),),
                    (9, 55)),
        ProductType("lipstick", "Beauty & Personal Care › Makeup › Lips › Lipstick",
                    ("Lipstick", "Matte Lipstick", "Lip Color"),
                    ("long lasting", "matte finish", "cruelty free", "moisturizing", "vegan", "waterproof",
                     "high pigment", "vitamin e"),
                    (("color", ("ruby red", "nude", "berry", "coral", "plum", "mauve", "fuchsia", "brick")),
                     ("pack", ("single", "set of 3", "set of 6"))),
                    (5, 28)),
        ProductType("nail polish",
                    "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish",
                    ("Nail Polish", "Gel Nail Polish", "Nail Lacquer"),
                    ("quick dry", "long lasting", "non toxic", "high shine", "chip resistant", "uv led cure",
                     "vegan", "cruelty free"),
                    (("color", ("cherry red", "baby pink", "midnight blue", "lilac", "mint", "gold glitter",
                                "sand", "plum")),),
                    (4, 24)),
        ProductType("hair dryer",
                    "Beauty & Personal Care › Hair Care › Styling Tools & Appliances › Hair Dryers",
                    ("Hair Dryer", "Blow Dryer", "Ionic Hair Dryer"),
                    ("ionic technology", "low noise", "fast drying", "diffuser attachment", "lightweight",
                     "foldable handle", "cool shot button", "ceramic"),
                    (("color", ("black", "white", "rose gold", "lavender", "teal")),
                     ("plug", ("us plug", "eu plug", "uk plug"))),
                    (19, 89)),
    )),
    Category("food", ("Golden Acre", "Harvest Lane", "Pantry Bloom", "Nordhaus", "Terra Verde",
                      "Little Orchard", "Blue Mesa", "Kettle & Crumb"), (
        ProductType("green tea", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green Tea",
                    ("Green Tea", "Green Tea Bags", "Loose Leaf Green Tea"),
                    ("organic", "caffeine free", "non gmo", "gluten free", "individually wrapped", "decaf",
                     "kosher", "antioxidant rich"),
                    (("flavor", ("jasmine", "mint", "lemon", "matcha", "ginger", "honey")),
                     ("size", ("20 count", "1 pound", "variety pack", "tin"))),
                    (4, 32)),
        ProductType("coffee beans",
                    "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Whole Coffee Beans",
                    ("Whole Bean Coffee", "Coffee Beans", "Whole Coffee Beans"),
                    ("medium roast", "dark roast", "fair trade", "organic", "single origin", "low acid",
                     "arabica", "kosher"),
                    (("size", ("12 ounce", "2 pounds", "5 lb bag", "sample")),
                     ("grind", ("whole bean", "ground", "espresso"))),
                    (8, 45)),
        ProductType("protein bars",
                    "Grocery & Gourmet Food › Snacks & Sweets › Snack Foods › Bars › Protein Bars",
                    ("Protein Bars", "Snack Bars", "Protein Snack Bars"),
                    ("gluten free", "high protein", "low sugar", "plant based", "keto friendly", "non gmo",
                     "dairy free", "individually wrapped"),
                    (("flavor",
                      ("chocolate chip", "peanut butter", "blueberry", "almond", "coconut", "caramel")),
                     ("size", ("12 count", "box of 24", "sampler"))),
                    (12, 42)),
        ProductType("olive oil",
                    "Grocery & Gourmet Food › Pantry Staples › Cooking & Baking › Oils › Olive Oil",
                    ("Olive Oil", "Extra Virgin Olive Oil", "Cooking Oil"),
                    ("extra virgin", "cold pressed", "organic", "non gmo", "glass bottle", "first harvest",
                     "single origin", "kosher"),
                    (("size", ("500 ml", "1 liter", "3 liter tin", "16.9 fl oz")),),
                    (9, 48)),
        ProductType("dark chocolate", "Grocery & Gourmet Food › Snacks & Sweets › Chocolate › Chocolate Bars",
                    ("Dark Chocolate", "Dark Chocolate Bar", "Chocolate Bars"),
                    ("dairy free", "fair trade", "sugar free", "individually wrapped", "organic", "vegan",
                     "gluten free", "high cocoa"),
                    (("flavor", ("sea salt", "orange", "raspberry", "mint", "almond", "espresso")),
                     ("pack", ("single bar", "pack of 4", "gift box"))),
                    (4, 30)),
    )),
    Category("fashion", ("Northwind", "Urban Thread", "Coastline", "Ridgeway", "Maple & Stone", "Vantage",
                         "Lark Lane", "Cobalt Co"), (
        ProductType("men's t-shirt", "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
                    ("T-Shirt", "Crew Neck T-Shirt", "Cotton Tee"),
                    ("machine wash", "cotton", "short sleeve", "slim fit", "moisture wicking", "relaxed fit",
                     "crew neck", "tagless"),
                    (("color", _COLORS), ("size", _SIZES)), (9, 35), (" for Men", " Men's")),
        ProductType("women's dress", "Clothing, Shoes & Jewelry › Women › Clothing › Dresses › Casual",
                    ("Dress", "Maxi Dress", "Midi Dress"),
                    ("machine wash", "polyester spandex", "long sleeve", "v neck", "a line", "pockets",
                     "floral print", "high waist"),
                    (("color", _COLORS), ("size", _SIZES)), (18, 65), (" for Women", " Women's")),
        ProductType("running shoes", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running",
                    ("Running Shoes", "Running Sneakers", "Trail Running Shoes"),
                    ("rubber sole", "non slip", "breathable mesh", "arch support", "lightweight",
                     "memory foam", "wide toe box", "lace up"),
                    (("color", _COLORS), ("size", ("7", "8", "9", "10", "11", "12", "13"))), (29, 120),
                    (" for Men", " Men's", "")),
        ProductType("women's jeans", "Clothing, Shoes & Jewelry › Women › Clothing › Jeans",
                    ("Jeans", "Skinny Jeans", "Denim Jeans"),
                    ("high waist", "stretch", "button closure", "skinny fit", "machine wash", "distressed",
                     "bootcut", "butt lifting"),
                    (("color", ("light wash", "black", "indigo", "grey", "white")),
                     ("size", ("24 regular", "26 short", "28 long", "30 petite"))), (19, 70),
                    (" for Women",)),
        ProductType("men's hoodie",
                    "Clothing, Shoes & Jewelry › Men › Clothing › Fashion Hoodies & Sweatshirts",
                    ("Hoodie", "Pullover Hoodie", "Zip Up Hoodie"),
                    ("fleece lined", "kangaroo pocket", "machine wash", "drawstring", "cotton blend",
                     "heavyweight", "zipper closure", "long sleeve"),
                    (("color", _COLORS), ("size", _SIZES)), (19, 60), (" for Men", " Men's")),
    )),
    Category("furniture", ("Oakridge", "Hearthline", "Nestwell", "Kinfolk Home", "Arbor & Co", "Loftly",
                           "Stillwater", "Birchwood"), (
        ProductType("office chair",
                    "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs › Desk Chairs",
                    ("Office Chair", "Desk Chair", "Ergonomic Office Chair"),
                    ("lumbar support", "adjustable height", "mesh back", "swivel", "easy assembly",
                     "padded armrests", "high back", "rolling casters"),
                    (("color", ("black", "grey", "white", "blue", "pink")),), (59, 299)),
        ProductType("bookshelf", "Home & Kitchen › Furniture › Living Room Furniture › Bookcases",
                    ("Bookshelf", "Bookcase", "Ladder Shelf"),
                    ("solid wood", "easy assembly", "5 tier", "space saving", "industrial", "metal frame",
                     "anti tip", "open shelves"),
                    (("color", ("walnut", "white", "black", "espresso", "oak", "grey")),), (39, 199)),
        ProductType("coffee table",
                    "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables",
                    ("Coffee Table", "Lift Top Coffee Table", "Round Coffee Table"),
                    ("storage shelf", "tempered glass", "solid wood", "mid century", "easy assembly",
                     "lift top", "metal legs", "rustic"),
                    (("color", ("walnut", "white", "black", "espresso", "oak", "grey")),), (49, 259)),
        ProductType("bar stools", "Home & Kitchen › Furniture › Kitchen & Dining Room Furniture › Bar Stools",
                    ("Bar Stools", "Counter Stools", "Swivel Bar Stools"),
                    ("counter height", "swivel", "faux leather", "back support", "footrest",
                     "adjustable height", "set of 2", "easy assembly"),
                    (("color", ("black", "white", "brown", "grey", "beige", "green")),), (45, 220)),
        ProductType("nightstand", "Home & Kitchen › Furniture › Bedroom Furniture › Nightstands",
                    ("Nightstand", "Bedside Table", "End Table"),
                    ("storage drawer", "charging station", "solid wood", "easy assembly", "open shelf",
                     "led light", "small space", "metal handles"),
                    (("color", ("walnut", "white", "black", "espresso", "oak", "grey")),
                     ("pack", ("single", "set of 2"))), (29, 149)),
    )),
    Category("electronics", ("Voltix", "Sonara", "Kestrel Audio", "Brightcore", "Nimbus Labs", "Axion",
                             "Pulsewave", "Lumen Tech"), (
        ProductType("bluetooth headphones",
                    "Electronics › Headphones, Earbuds & Accessories › Headphones › Over-Ear",
                    ("Bluetooth Headphones", "Wireless Headphones", "Over Ear Headphones"),
                    ("noise cancelling", "wireless bluetooth", "long battery life", "built in microphone",
                     "foldable", "hi fi sound", "memory foam ear cups", "usb c charging"),
                    (("color", ("black", "white", "navy", "rose gold", "grey")),), (19, 199)),
        ProductType("wall charger", "Electronics › Accessories & Supplies › Chargers › Wall Chargers",
                    ("Wall Charger", "USB C Charger", "Fast Charger"),
                    ("fast charging", "usb c", "foldable plug", "gan technology", "dual port",
                     "overheat protection", "compact design", "travel ready"),
                    (("wattage", ("20w", "35w", "65w", "100w")), ("color", ("black", "white"))), (9, 59)),
        ProductType("hdmi cable",
                    "Electronics › Accessories & Supplies › Audio & Video Accessories › Cables › HDMI Cables",
                    ("HDMI Cable", "High Speed HDMI Cable", "8K HDMI Cord"),
                    ("4k 120hz", "high speed", "gold plated", "braided", "ethernet", "8k", "hdr",
                     "backward compatible"),
                    (("size", ("3 feet", "6 feet", "10 feet", "25 feet")), ("pack", ("1 pack", "2 pack"))),
                    (6, 35)),
        ProductType("wireless mouse",
                    "Electronics › Computers & Accessories › Keyboards, Mice & Accessories › Mice",
                    ("Wireless Mouse", "Computer Mouse", "Ergonomic Mouse"),
                    ("ergonomic", "silent click", "rechargeable", "usb receiver", "long battery life",
                     "bluetooth", "adjustable dpi", "ambidextrous"),
                    (("color", ("black", "white", "grey", "pink", "blue")),), (8, 69)),
        ProductType("portable speaker",
                    "Electronics › Portable Audio & Video › Portable Speakers & Docks › Bluetooth Speakers",
                    ("Portable Speaker", "Bluetooth Speaker", "Outdoor Speaker"),
                    ("waterproof", "bluetooth 5.0", "long battery life", "built in microphone", "deep bass",
                     "stereo pairing", "shockproof", "usb c charging"),
                    (("color", ("black", "blue", "red", "camo", "teal")),), (19, 149)),
    )),
)

_BENEFITS = (
    "made to last through everyday use", "a customer favorite for its quality",
    "designed with care and tested "
    "for quality", "backed by a 30 day money back guarantee", "thoughtfully made for daily routines",
    "carefully checked before it ships", "a reliable choice at a fair price",
    "easy to love from the first use",
)
_REVIEW_TITLES = {5: ("Love it", "Exactly what I wanted", "Excellent quality", "Would buy again"),
                  4: ("Very good", "Nice, with small flaws", "Good value"),
                  3: ("It's okay", "Average", "Does the job"),
                  2: ("Not great", "Expected more"),
                  1: ("Disappointed", "Would not buy again")}
_REVIEW_BODIES = {5: "This {q} is great. It arrived quickly and works exactly as described.",
                  4: "Happy with this {q} overall; the quality is good for the price.",
                  3: "The {q} is fine but nothing special.",
                  2: "The {q} was not what I hoped for and feels cheaply made.",
                  1: "My {q} stopped working after a week and support never answered."}
_GOAL_TEMPLATES = (
    "i am looking for {a} {attrs} {noun}{opts}",
    "i need {a} {noun} that is {attrs}{opts}",
    "find me {a} {attrs} {noun}{opts}",
    "i want to buy {a} {noun} which is {attrs}{opts}",
    "i'm searching for {a} {attrs} {noun}{opts}",
)


def _article(noun: str) -> str:
    if ((noun.endswith("s") and not noun.endswith("ss"))
        or noun.endswith(("jeans", "oil", "tea", "coffee", "chocolate"))):
        return "some"
    return "an" if noun[0] in "aeiou" else "a"


def _distinct(values: Sequence[str], taken: list[str]) -> bool:
    """Whether an option value would be told apart by the reward from every value already taken."""
    return all(not fuzzy_match(normalize_color(v), normalize_color(t)) for v in values for t in taken)


def _asin(rng: random.Random, used: set[str]) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    while True:
        a = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if a not in used:
            used.add(a)
            return a


def _product(rng: random.Random, cat: Category, pt: ProductType, asin: str) -> dict[str, Any]:
    brand = rng.choice(cat.brands)
    attrs = rng.sample(pt.attributes, rng.randint(3, 5))
    noun = rng.choice(pt.nouns)
    shown = [a.title() for a in attrs[:rng.randint(1, 2)]]
    title = f"{brand} {' '.join(shown)} {noun}{rng.choice(pt.suffixes)}"
    options: dict[str, list[str]] = {}
    taken: list[str] = []
    for i, (name, pool) in enumerate(pt.options):
        if i > 0 and rng.random() < 0.3:
            continue
        values: list[str] = []
        want = rng.randint(2, 5)
        for v in rng.sample(pool, len(pool)):
            if len(values) >= want:
                break
            if _distinct([v], taken):
                values.append(v)
                taken.append(v)
        if len(values) >= 2:
            options[name] = values
    lo, hi = pt.price
    price = round(rng.uniform(lo, hi)) - 0.01
    bullets = [f"{a.upper()}: {rng.choice(_BENEFITS)}." for a in attrs]
    rng.shuffle(bullets)
    plural = noun.endswith("s") and not noun.endswith("ss")
    description = (f"The {brand} {noun.lower()} {'are' if plural else 'is'} {rng.choice(_BENEFITS)}. "
                   f"{'They are' if plural else 'It is'} {' and '.join(attrs[:2])}, with "
                   f"{' and '.join(attrs[2:]) or 'a clean design'}. {rng.choice(_BENEFITS).capitalize()}.")
    scores = [rng.choice((5, 5, 5, 4, 4, 3, 2, 1)) for _ in range(rng.randint(2, 4))]
    reviews = [{"title": rng.choice(_REVIEW_TITLES[s]), "stars": s,
                "review": _REVIEW_BODIES[s].format(q=pt.query)}
               for s in scores]
    return {
        "asin": asin, "name": title, "category": cat.name, "query": pt.query,
        "product_category": pt.breadcrumb, "full_description": description, "small_description": bullets,
        "pricing": f"${price:.2f}", "images": [f"https://images.example/webshop/{asin}.jpg"], "brand": brand,
        "customization_options": {n: [{"value": v, "image": None} for v in vs] for n, vs in options.items()},
        "_attributes": attrs, "_reviews": reviews, "_noun": pt.query,
    }


def _goal_text(rng: random.Random, noun: str, attrs: Sequence[str], opts: dict[str, str]) -> str:
    opt_parts = []
    for name, value in opts.items():
        if name == "color":
            opt_parts.append(f"in {value} color")
        elif name == "size":
            opt_parts.append(f"in size {value}")
        else:
            opt_parts.append(f"with {name} {value}")
    opt_text = (", " + " and ".join(opt_parts)) if opt_parts else ""
    template = rng.choice(_GOAL_TEMPLATES)
    return template.format(a=_article(noun), attrs=" and ".join(attrs), noun=noun, opts=opt_text)


def generate_catalog(out: str | Path, *, seed: int = 0, products_per_type: int = 22,
                     test_goals: int = 100) -> Path:
    """Write a catalog of `products_per_type` products for each of the 25 product types (5 categories)
    and one goal per product, `test_goals` of them held out as the `test` split. Returns `out`."""
    if products_per_type < 2:
        raise ValueError("products_per_type must be >= 2 (a goal product needs distractors), got "
                         f"{products_per_type}")
    rng = random.Random(seed)
    used: set[str] = set()
    records = [_product(rng, cat, pt, _asin(rng, used))
               for cat in CATEGORIES for pt in cat.types for _ in range(products_per_type)]
    rng.shuffle(records)  # items_shuffle: the file WebShop ships is shuffled too
    if not 0 <= test_goals < len(records):
        raise ValueError(f"test_goals must be in [0, {len(records)}), got {test_goals}")

    items, attrs, human, reviews, goals = [], {}, {}, [], []
    for rec in records:
        a, rv, noun = rec.pop("_attributes"), rec.pop("_reviews"), rec.pop("_noun")
        items.append(rec)
        k = rng.choice((1, 2, 2, 2, 3)) if len(a) >= 3 else len(a)
        goal_attrs = rng.sample(a, k)
        opts = {n: rng.choice([c["value"] for c in cs]) for n, cs in rec["customization_options"].items()}
        text = _goal_text(rng, noun, goal_attrs, opts)
        attrs[rec["asin"]] = {"attributes": a, "instruction": _goal_text(rng, noun, goal_attrs, {}),
                              "instruction_attributes": goal_attrs}
        human[rec["asin"]] = [{"asin": rec["asin"], "instruction": text, "instruction_attributes": goal_attrs,
                               "instruction_options": list(opts.values())}]
        reviews.append({"asin": rec["asin"], "reviews": rv,
                        "average_rating": round(sum(r["stars"] for r in rv) / len(rv), 1)})
        price = float(rec["pricing"][1:])
        limit = price_limit(price, rng)
        goals.append({"asin": rec["asin"], "instruction_text": text + price_clause(limit),
                      "attributes": goal_attrs, "goal_options": list(opts.values()), "price_upper": limit,
                      "query": rec["query"], "category": rec["category"],
                      "product_category": rec["product_category"], "name": rec["name"], "weight": 1.0})
    order = list(range(len(goals)))
    rng.shuffle(order)
    held_out = set(order[:test_goals])
    n_test = n_train = 0
    for i, g in enumerate(goals):
        if i in held_out:
            g["split"], g["goal_id"], n_test = "test", f"test-{n_test:04d}", n_test + 1
        else:
            g["split"], g["goal_id"], n_train = "train", f"train-{n_train:04d}", n_train + 1
    goals.sort(key=lambda g: (g["split"] != "train", g["goal_id"]))

    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    _write_list(d / "items_shuffle.json", items)
    _write_obj(d / "items_ins_v2.json", attrs)
    _write_obj(d / "items_human_ins.json", human)
    _write_list(d / "reviews.json", reviews)
    _write_list(d / "goals.json", [{k: g[k] for k in _GOAL_KEYS} for g in goals])
    _check(d)
    return d


_GOAL_KEYS = ("goal_id", "split", "asin", "instruction_text", "attributes", "goal_options", "price_upper",
              "query", "category", "product_category", "name", "weight")


def _write_list(path: Path, rows: list) -> None:
    # One record per line: diffs of a regenerated catalog stay readable.
    body = ",\n".join(json.dumps(r, ensure_ascii=False, sort_keys=True) for r in rows)
    path.write_text(f"[\n{body}\n]\n", encoding="utf-8")


def _write_obj(path: Path, obj: dict) -> None:
    body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False, sort_keys=True)}"
                      for k, v in obj.items())
    path.write_text(f"{{\n{body}\n}}\n", encoding="utf-8")


def _check(d: Path) -> None:
    """Every goal must be satisfiable: its own product, with its options, scores 1.0."""
    cat = load_catalog(d)
    for g in cat.goals:
        p = cat.by_asin[g.asin]
        chosen = {}
        names = p.option_names()
        for _, v in g.goal_options:
            chosen[names[v]] = v
        r = purchase_reward(p, g, p.price, chosen)
        if r.score != 1.0:
            raise AssertionError(f"generator bug: goal {g.goal_id} scores {r} on its own product")
