"""A small WebShop catalog in WebShop's original file schema, written by hand for exact tests.

Products: the goal's shampoo (P1), a distractor shampoo (P2), a range-priced conditioner (P3), a
mouse (P4), 11 filler shampoos (so "shampoo" has 13 results: two result pages), plus records WebShop
skips (asin 'nan', a duplicate asin).
"""

from __future__ import annotations

import json
from pathlib import Path

P1, P2, P3, P4 = "B000000001", "B000000002", "B000000003", "B000000004"

P1_TITLE = "Acme Sulfate Free Tea Tree Shampoo"


def _opts(**groups: list[str]) -> dict:
    return {name: [{"value": v, "image": None} for v in values] for name, values in groups.items()}


def products() -> list[dict]:
    rows = [
        {"asin": P1, "name": P1_TITLE, "category": "beauty", "query": "Shampoo ",
         "product_category": "Beauty & Personal Care › Hair Care › Shampoos",
         "full_description": "A gentle daily shampoo for every hair type.",
         "small_description": ["Sulfate free formula", "Tea tree oil for a fresh scalp"],
         "pricing": "$12.99", "images": ["img/p1.jpg"],
         "customization_options": _opts(size=["8 fl oz", "16.9 fl oz"], scent=["Lavender", "Coconut"])},
        {"asin": P2, "name": "Bloom Paraben Free Argan Oil Shampoo", "category": "beauty", "query": "shampoo",
         "product_category": "Beauty & Personal Care › Hair Care › Shampoos",
         "full_description": "Argan oil shampoo for shine.", "small_description": ["Paraben free"],
         "pricing": "$25.00", "images": ["img/p2.jpg"],
         "customization_options": _opts(size=["8 fl oz", "16 oz"])},
        {"asin": P3, "name": "Bloom Argan Conditioner", "category": "beauty", "query": "conditioner",
         "product_category": "Beauty & Personal Care › Hair Care › Conditioners",
         "full_description": "Smooth conditioner.", "small_description": "Silky hair",
         "pricing": "$10.00 - $20.00", "images": ["img/p3.jpg"],
         "customization_options": _opts(color=["Black/White"])},
        {"asin": P4, "name": "Zephyr Wireless Mouse", "category": "electronics", "query": "wireless mouse",
         "product_category": "Electronics › Computers › Mice", "full_description": "A quiet mouse.",
         "small_description": ["Silent click"], "pricing": "", "images": ["img/p4.jpg"],
         "customization_options": None},
        {"asin": "nan", "name": "skipped", "category": "beauty", "query": "x", "product_category": "x",
         "full_description": "", "small_description": [], "pricing": "$1", "images": [""]},
        {"asin": P2, "name": "duplicate, skipped", "category": "beauty", "query": "x",
         "product_category": "x", "full_description": "", "small_description": [], "pricing": "$1",
         "images": [""]},
    ]
    for i in range(11):
        rows.append({"asin": f"B00000010{i:X}", "name": f"Filler Shampoo {i}", "category": "beauty",
                     "query": "shampoo", "product_category": "Beauty & Personal Care › Hair Care › Shampoos",
                     "full_description": "A plain shampoo.", "small_description": ["Basic"],
                     "pricing": f"${5 + i}.50", "images": [""], "customization_options": {}})
    return rows


def attributes() -> dict:
    return {
        P1: {"attributes": ["sulfate free", "tea tree", "natural ingredients"],
             "instruction": "i need a sulfate free tea tree shampoo", "instruction_attributes": ["sulfate "
                                                                                                 "free",
                                                                                                 "tea tree"]},
        P2: {"attributes": ["paraben free", "argan oil"]},
        P3: {"attributes": ["argan oil"], "instruction": "i want an argan conditioner",
             "instruction_attributes": ["argan oil"]},
    }


def human() -> dict:
    return {P1: [{"asin": P1,
                  "instruction": "i need a sulfate free tea tree shampoo in 8 fl oz with lavender scent.",
                  "instruction_attributes": ["sulfate free", "tea tree"],
                  "instruction_options": ["8 fl oz", "lavender"]},
                 {"asin": P1, "instruction": "no attributes: WebShop skips this goal",
                  "instruction_attributes": [], "instruction_options": []}]}


def reviews() -> list:
    return [{"asin": P1, "average_rating": 4.5,
             "reviews": [{"title": "Great", "stars": 5, "review": "Smells lovely."},
                         {"title": "Fine", "stars": "4.0", "review": "Does the job."}]}]


GOALS = [
    {"goal_id": "g1", "split": "test", "asin": P1,
     "instruction_text": "i need a sulfate free tea tree shampoo in 8 fl oz with lavender scent, and price "
                         "lower than 20.00 dollars",
     "attributes": ["sulfate free", "tea tree"], "goal_options": ["8 fl oz", "lavender"],
     "price_upper": 20.0},
    # the same purchase, but the product's 12.99 is over this goal's limit
    {"goal_id": "cheap", "split": "train", "asin": P1,
     "instruction_text": "i need a sulfate free tea tree shampoo in 8 fl oz with lavender scent, and price "
                         "lower than 10.00 dollars",
     "attributes": ["sulfate free", "tea tree"], "goal_options": ["8 fl oz", "lavender"],
     "price_upper": 10.0},
]


def write_catalog(d: Path, *, goals: bool = True, with_human: bool = True) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "items_shuffle_15.json").write_text(json.dumps(products()))
    (d / "items_ins_v2_15.json").write_text(json.dumps(attributes()))
    if with_human:
        (d / "items_human_ins.json").write_text(json.dumps(human()))
    (d / "reviews.json").write_text(json.dumps(reviews()))
    if goals:
        (d / "goals.json").write_text(json.dumps(GOALS))
    return d
