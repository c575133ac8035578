"""WebShop's purchase reward, checked by hand on cases from WebShop's own reward rules and tests
(web_agent_site/engine/goal.py and tests/web-agent-site/engine/test_goal.py)."""

from __future__ import annotations

from math import isclose

import pytest

from swerl.envs.webshop.data import Goal, Product
from swerl.envs.webshop.normalize import fuzzy_match, fuzzy_score, normalize_color, normalize_named_option
from swerl.envs.webshop.reward import (
    attribute_matches,
    option_matches,
    purchase_reward,
    title_nouns,
    type_reward,
)


def product(**kw) -> Product:
    base = dict(asin="B000000001", name="Name 1", category="beauty", query="Query 1",
                product_category="a › b › c", description="", bullet_points=(), pricing=(35.0,), price=35.0,
                attributes=())
    base.update(kw)
    return Product(**base)


def goal(**kw) -> Goal:
    base = dict(goal_id="g", asin="B000000001", instruction_text="buy it", attributes=("x",), goal_options=(),
                price_upper=40.0, query="Query 1", category="beauty", product_category="a › b › c",
                name="Name 1")
    base.update(kw)
    return Goal(**base)


# ---- type reward --------------------------------------------------------------------------------

def test_type_reward_query_and_category_rules() -> None:
    g = {"query": "Query 1", "product_category": "a › b › c", "name": "Name 1"}
    r = type_reward(dict(g), g)
    assert (r.r_type, r.query_match, r.category_match, r.title_score) == (1.0, True, True, 1.0)
    assert not type_reward(dict(g, query="Query 2"), g).query_match
    # two shared breadcrumb levels, in any order, make a category match; repeats count once
    for crumbs, match in [("b › c › a", True), ("d › e › f", False), ("a › d › b", True), ("a › a › b", True),
                          ("a › a › d", False)]:
        assert type_reward(dict(g, product_category=crumbs), g).category_match is match, crumbs


def test_type_reward_title_overlap_on_webshop_cases() -> None:
    short = "Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar"
    brst = ("BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home "
            "Theater System")
    # goal nouns: saireed ul listed prong power cord jbl bar bar channel 4k hd soundbar (13; numbers, 'for'
    # and 'ultra' dropped); shared with the purchase: power, cord -> 2/13 = 0.1538 (WebShop's test: 0.15)
    g = {"query": "q", "product_category": "a › b › c", "name": short}
    p = {"query": "q2", "product_category": "a › d › e", "name": brst}
    r = type_reward(p, g)
    assert isclose(r.title_score, 2 / 13) and isclose(r.title_score, 0.15, abs_tol=1e-2)
    # neither query nor category nor > 20% of nouns: 0.5 (and not below 10%, so it stays 0.5)
    assert r.r_type == 0.5
    # + "Home Theater System Subwoofer": 17 nouns, 5 shared (power cord home theater system) = 0.294 (WebShop:
    # 0.3)
    r = type_reward(p, dict(g, name=short + " Home Theater System Subwoofer"))
    assert isclose(r.title_score, 5 / 17) and isclose(r.title_score, 0.3, abs_tol=1e-2) and r.r_type == 1.0
    # basketball shoes vs basketball sneakers: well above 20% overlap
    r = type_reward({"query": "x", "product_category": "x",
                     "name": "PEAK High Top Mens Basketball Shoes Lou Williams "
                     "Streetball Master Breathable Non Slip Outdoor Sneakers"},
                    {"query": "y", "product_category": "y",
                     "name": "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White"})
    assert r.title_score > 0.2 and r.r_type == 1.0
    # nothing in common: title_score 0 sets r_type to 0 even though the query matches
    r = type_reward({"query": "q", "product_category": "x",
                     "name": "Minkissy 2pcs Stainless Steel Eyebrow Tweezers "
                     "Blackhead Acne Remover Portable Makeup Tweezers (Silver)"},
                    {"query": "q", "product_category": "y",
                     "name": "Rusticware 921ORB Kitchen and Bath Cabinet Knob"})
    assert r.title_score == 0.0 and r.query_match and r.r_type == 0.0


def test_type_reward_under_ten_percent_overrides_query_match() -> None:
    # goal nouns: alpha beta gamma delta epsilon zeta eta theta iota kappa lambda (11); 1 shared -> 1/11 < 0.1
    g = {"query": "q", "product_category": "a › b",
         "name": "alpha beta gamma delta epsilon zeta eta theta iota kappa "
         "lambda"}
    r = type_reward({"query": "q", "product_category": "a › b", "name": "alpha omega"}, g)
    assert isclose(r.title_score, 1 / 11) and r.query_match and r.category_match and r.r_type == 0.1


def test_title_nouns_drop_numbers_function_words_and_modifiers() -> None:
    assert title_nouns("Acme 2 Pack Organic Green Tea for the Office, 100 Count") == [
        "acme", "pack", "tea", "office", "count"]
    assert title_nouns("") == []


# ---- attributes and options -----------------------------------------------------------------------

def test_attribute_matches_webshop_cases() -> None:
    want = ("tea tree", "essential oils", "natural ingredients")
    # "essential oil" vs "essential oils": token-set ratio 96 > 85
    assert attribute_matches(product(attributes=("tea tree", "essential oil", "natural ingredients")),
                             want) == 3
    assert attribute_matches(product(attributes=("essential oil", "natural ingredients")), want) == 2
    # not among the attributes, but written in the bullets / description
    p = product(bullet_points=("This shampoo has essential oils and smells like lemons",),
                description="Best shampoo on the market, made with natural ingredients")
    assert attribute_matches(p, want) == 2
    p = product(attributes=("tea bag", "earl gray", "lipton"), name="English tea for breakfast",
                bullet_points=("Soothing aroma", "Calming, great feeling"),
                description="Best tea made by Lipton, great to pair with breakfast")
    assert attribute_matches(p, want) == 0
    # the title counts too, lower-cased; the goal attribute itself is not lower-cased (WebShop's rule)
    assert attribute_matches(product(name="Sulfate Free Shampoo"), ("sulfate free",)) == 1
    assert attribute_matches(product(name="Sulfate Free Shampoo"), ("Sulfate Free X",)) == 0


def test_option_matches_webshop_cases() -> None:
    named = lambda vs: [(None, v) for v in vs]  # noqa: E731 - human goals: values only
    assert option_matches(["pack of 12", "grey", "XL"], named(["grey", "XL", "pack of 12"])) == 3
    assert option_matches(["pack of 12", "blue", "XL"], named(["grey", "XL", "pack of 12"])) == 2
    # fuzzy: "powder snow" is a token subset of "cool powder snow" -> 100
    assert option_matches(["pack of 12", "powder snow", "XL"],
                          named(["cool powder snow", "XL", "pack of 12"])) == 3
    # WebShop's rule is lenient: "33.8 fl oz" holds every token of "8 fl oz", so it counts as 8 fl oz
    assert option_matches(["33.8 fl oz"], named(["8 fl oz"])) == 1
    assert option_matches(["goal 1"], []) == 0
    assert option_matches([], named(["goal 1", "goal 2"])) == 0


def test_option_colour_normalisation() -> None:
    assert normalize_color("navy blue") == "blue"  # 'blue' comes before 'navy' in the list
    assert normalize_color("light wash") == "ash"  # substring, as WebShop does
    assert normalize_color("medium") == "medium"
    # different shades of blue normalise to the same colour and so match
    assert option_matches(["light blue"], [(None, "navy blue")]) == 1
    # different colours do not: red vs black
    assert option_matches(["dark red"], [(None, "black")]) == 0
    # named options (synthetic goals): a colour equal to the name or value, else both tokens
    assert normalize_named_option("color", "grey") == "grey"
    assert normalize_named_option("color", "navy blue") == "color navy blue"
    assert option_matches(["xl"], [("size", "xl")]) == 1  # {'xl'} is a token subset of {'size', 'xl'}
    assert option_matches(["small"], [("size", "xl")]) == 0


def test_fuzzy_score_is_thefuzz_token_set_ratio() -> None:
    assert fuzzy_score("Tea-Tree!", "tea tree") == 100  # case and punctuation are ignored
    assert fuzzy_score("", "x") == 0
    # "8 fl oz" vs "12 fl oz": sorted intersection "fl oz"; best of ratio("fl oz", "fl oz 8") = 2*5/12 = 83.3,
    # ratio("fl oz", "fl oz 12") = 10/13 = 76.9, ratio("fl oz 8", "fl oz 12") = 2*6/15 = 80 -> 83
    assert fuzzy_score("8 fl oz", "12 fl oz") == 83 and not fuzzy_match("8 fl oz", "12 fl oz")
    # "pack of 2" vs "pack of 3": ratio("of pack 2", "of pack 3") = 2*8/18 = 88.9 -> 89 > 85: WebShop counts a
    # match
    assert fuzzy_score("pack of 2", "pack of 3") == 89 and fuzzy_match("pack of 2", "pack of 3")
    assert isinstance(fuzzy_score("a b", "a c"), int)


# ---- the total ------------------------------------------------------------------------------------

def _webshop_case() -> tuple[Product, Goal]:
    name = "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White"
    p = product(name=name, attributes=("tea tree", "essential oil", "natural ingredients"))
    g = goal(name=name, attributes=("tea tree", "essential oils", "natural ingredients"),
             goal_options=(("color", "grey"), ("size", "XL")), price_upper=40.0)
    return p, g


def test_reward_exact_match_is_one() -> None:
    p, g = _webshop_case()
    r = purchase_reward(p, g, 35.0, {"color": "grey", "size": "XL"})
    # (3 attributes + 2 options + price) / (3 + 2 + 1) * r_type 1
    assert r.score == 1.0 and r.r_att == 1.0 and r.r_option == 1.0 and r.r_price
    assert isclose(r.w_att, 3 / 6) and isclose(r.w_option, 2 / 6) and isclose(r.w_price, 1 / 6)


def test_reward_fractions() -> None:
    p, g = _webshop_case()
    p = product(name=p.name, attributes=(),
                bullet_points=("This shampoo has essential oils and smells like lemons",),
                description="Best shampoo on the market, made with natural ingredients")
    opts = {"color": "grey", "size": "XL"}
    # attributes: essential oils (bullets) + natural ingredients (description) = 2 of 3
    # (2 + 2 + 1) / (3 + 2 + 1) = 5/6
    assert isclose(purchase_reward(p, g, 35.0, opts).score, 5 / 6)
    # a third goal option that was not chosen: (2 + 2 + 1) / (3 + 3 + 1) = 5/7
    g3 = goal(name=g.name, attributes=g.attributes, price_upper=40.0,
              goal_options=(("color", "grey"), ("size", "XL"), ("amount", "pack of 12")))
    r = purchase_reward(p, g3, 35.0, opts)
    assert isclose(r.score, 5 / 7) and isclose(r.r_option, 2 / 3) and r.num_option_matches == 2
    # a different kind of product: query and breadcrumbs differ, 2/13 of the title nouns shared -> r_type 0.5
    p2 = product(name="BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR "
                      "Combo Home Theater System", query="Query 2", product_category="a › d › e",
                 attributes=(), bullet_points=p.bullet_points, description=p.description)
    g4 = goal(name="Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD "
                   "Soundbar",
              attributes=g.attributes, goal_options=g3.goal_options, price_upper=40.0)
    r = purchase_reward(p2, g4, 35.0, opts)
    assert r.r_type == 0.5 and isclose(r.score, 5 / 7 * 0.5)


def test_reward_over_price_is_penalised() -> None:
    p, g = _webshop_case()
    # 45 > 40: (3 + 2 + 0) / 6 = 5/6
    r = purchase_reward(p, g, 45.0, {"color": "grey", "size": "XL"})
    assert isclose(r.score, 5 / 6) and not r.r_price
    # exactly at the limit is within it
    assert purchase_reward(p, g, 40.0, {"color": "grey", "size": "XL"}).score == 1.0


def test_reward_info_items_in_fixed_order() -> None:
    p, g = _webshop_case()
    items = dict(purchase_reward(p, g, 45.0, {"color": "grey"}).items())
    assert list(items)[:3] == ["score", "r_type", "r_att"]
    # (3 + 1 + 0) / 6
    assert isclose(items["score"], 4 / 6) and items["r_option"] == 0.5 and items["r_price"] == 0.0
    no_opts = goal(name=g.name, attributes=g.attributes, price_upper=40.0)
    assert "r_option" not in dict(purchase_reward(p, no_opts, 1.0, {}).items())


def test_goal_validation() -> None:
    with pytest.raises(ValueError, match="at least one attribute"):
        goal(attributes=())
    with pytest.raises(ValueError, match="price_upper"):
        goal(price_upper=0.0)
