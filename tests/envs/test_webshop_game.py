"""WebShopGame: pages, navigation, actions as WebShop parses them, invalid actions, and purchase scores
computed by hand on a small catalog (tests/envs/webshop_fixtures.py)."""

from __future__ import annotations

from math import isclose
from pathlib import Path

import pytest
from webshop_fixtures import P1, P1_TITLE, P2, P4, write_catalog

from swerl.envs.webshop import WebShopExpert, WebShopGame, parse_action
from swerl.envs.webshop.data import CatalogError

INSTR = ("i need a sulfate free tea tree shampoo in 8 fl oz with lavender scent, and price lower than 20.00 "
         "dollars")
P1L, P2L, P4L = P1.lower(), P2.lower(), P4.lower()
SEARCH = "search[sulfate free tea tree shampoo]"  # P1 first, P2 second, then the 11 fillers


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_catalog(tmp_path_factory.mktemp("webshop"))


@pytest.fixture
def game(catalog_dir: Path) -> WebShopGame:
    g = WebShopGame(str(catalog_dir))
    g.reset("g1")
    return g


def play(game: WebShopGame, *actions: str):
    obs = None
    for a in actions:
        obs = game.step(a)
        assert obs.valid, (a, obs.info_dict().get("feedback"))
    return obs


def test_search_page(catalog_dir: Path) -> None:
    g = WebShopGame(str(catalog_dir))
    obs = g.reset("g1")
    assert obs.observation == f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"
    assert obs.admissible == ("search[<your query>]",)
    assert g.available_actions() == {"has_search_bar": True, "clickables": ["search"]}
    assert obs.info_dict() == {"page": "search", "goal_id": "g1", "task": INSTR}
    assert not obs.done and obs.reward == 0.0


def test_results_pagination_and_prev(game: WebShopGame) -> None:
    # "shampoo" is in P1, P2 and the 11 fillers: 13 results, 10 on page 1
    p1 = game.step("search[shampoo]")
    assert "Page 1 (Total results: 13)" in p1.observation
    assert p1.observation.startswith(f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] Page 1 (Total "
                                     "results: 13) [SEP] Next > [SEP] ")
    assert "< Prev" not in p1.observation
    assert p1.admissible[:2] == ("click[back to search]", "click[next >]")
    # the fillers tie (same length, one "shampoo" each) and come in catalog order, before P2 and P1
    assert p1.admissible[2:] == tuple(f"click[b00000010{i:x}]" for i in range(10))
    p2 = game.step("click[next >]")
    assert p2.observation.endswith(f"{P2} [SEP] Bloom Paraben Free Argan Oil Shampoo [SEP] $25.0 [SEP] {P1} "
                                   f"[SEP] {P1_TITLE} [SEP] $12.99")
    assert "Page 2 (Total results: 13) [SEP] < Prev [SEP] Next >" in p2.observation
    assert p2.admissible[:3] == ("click[back to search]", "click[< prev]", "click[next >]")
    assert len(p2.admissible) == 3 + 3
    assert not set(p1.admissible[2:]) & set(p2.admissible[3:])  # different products
    back = game.step("click[< prev]")
    assert back.observation == p1.observation and back.admissible == p1.admissible
    # past the last page: WebShop still offers Next > and shows an empty page
    play(game, "click[next >]")
    p3 = game.step("click[next >]")
    assert p3.observation.endswith("Page 3 (Total results: 13) [SEP] < Prev [SEP] Next >")


def test_item_page_sub_pages_and_back_navigation(game: WebShopGame) -> None:
    results = game.step("search[sulfate free tea tree shampoo]")
    item = game.step(f"click[{P1L}]")
    assert item.observation == (
        f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] < Prev [SEP] size [SEP] 8 fl oz [SEP] 16.9 "
        f"fl oz [SEP] scent [SEP] lavender [SEP] coconut [SEP] {P1_TITLE} [SEP] Price: $12.99 [SEP] Rating: "
        "4.5 [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert item.admissible == ("click[back to search]", "click[< prev]", "click[description]",
                               "click[features]", "click[reviews]", "click[buy now]", "click[8 fl oz]",
                               "click[16.9 fl oz]", "click[lavender]", "click[coconut]")
    head = f"Instruction: [SEP] {INSTR} [SEP] Back to Search [SEP] < Prev [SEP] "
    assert game.step("click[description]").observation == head + "A gentle daily shampoo for every hair type."
    assert game.step("click[< prev]").observation == item.observation
    assert game.step("click[features]").observation == head + ("Sulfate free formula [SEP] Tea tree oil for "
                                                               "a fresh scalp")
    reviews = game.step("click[< prev]") and game.step("click[reviews]")
    assert reviews.observation == head + ('"Great" [SEP] 5 [SEP] Smells lovely. [SEP] "Fine" [SEP] 4 [SEP] '
                                          'Does the job.')
    assert reviews.admissible == ("click[back to search]", "click[< prev]")
    # item page -> < Prev -> the same results page
    game.step("click[< prev]")
    assert game.step("click[< prev]").observation == results.observation
    # Back to Search from anywhere: the search page again
    game.step(f"click[{P1L}]")
    start = game.step("click[back to search]")
    assert start.observation == f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"
    assert start.admissible == ("search[<your query>]",)


def test_expert_scores_one(catalog_dir: Path) -> None:
    g = WebShopGame(str(catalog_dir))
    obs = g.reset("g1")
    expert = WebShopExpert(g.goal)
    actions = []
    while not obs.done:
        actions.append(expert.act(obs))
        obs = g.step(actions[-1])
        assert obs.valid
    assert actions[1:] == [f"click[{P1L}]", "click[8 fl oz]", "click[lavender]", "click[buy now]"]
    assert obs.reward == 1.0 and obs.won and obs.done
    info = obs.info_dict()
    assert info["purchased_asin"] == P1 and info["goal_asin"] == P1 and info["score"] == 1.0
    assert obs.observation == "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0"
    assert obs.admissible == ()
    with pytest.raises(RuntimeError, match="episode is over"):
        g.step("click[buy now]")


def test_wrong_and_missing_options_score_the_formula_fraction(game: WebShopGame) -> None:
    # goal g1: attributes (sulfate free, tea tree), options (8 fl oz, lavender), limit 20.00; P1 costs 12.99
    obs = play(game, SEARCH, f"click[{P1L}]", "click[16.9 fl oz]", "click[coconut]", "click[buy now]")
    # 2 attributes + 0 options + price = 3 of (2 + 2 + 1) -> 3/5
    info = obs.info_dict()
    assert isclose(obs.reward, 3 / 5) and not obs.won and obs.done
    assert (info["r_att"], info["r_option"], info["r_price"], info["r_type"]) == (1.0, 0.0, 1.0, 1.0)
    assert (isclose(info["w_att"], 2 / 5) and isclose(info["w_option"], 2 / 5)
            and isclose(info["w_price"], 1 / 5))
    game.reset("g1")
    # only the scent: (2 + 1 + 1) / 5 = 4/5
    obs = play(game, SEARCH, f"click[{P1L}]", "click[lavender]", "click[buy now]")
    assert isclose(obs.reward, 4 / 5)
    game.reset("g1")
    # a later click in the same group replaces the earlier one: size ends as 8 fl oz -> (2 + 2 + 1) / 5
    obs = play(game, SEARCH, f"click[{P1L}]", "click[16.9 fl oz]", "click[lavender]", "click[8 fl oz]",
               "click[buy now]")
    assert obs.reward == 1.0


def test_over_price_is_penalised(catalog_dir: Path) -> None:
    g = WebShopGame(str(catalog_dir))
    g.reset("cheap")  # the same goal with a 10.00 limit; P1 costs 12.99
    obs = play(g, SEARCH, f"click[{P1L}]", "click[8 fl oz]", "click[lavender]", "click[buy now]")
    # (2 + 2 + 0) / 5
    assert isclose(obs.reward, 4 / 5) and obs.info_dict()["r_price"] == 0.0 and not obs.won


def test_other_products_score_by_type_and_attributes(game: WebShopGame) -> None:
    # P2 (Bloom Paraben Free Argan Oil Shampoo, 25.00): no goal attribute anywhere in it, "8 fl oz" matches,
    # 25 > 20;
    # title nouns: goal acme sulfate tea tree shampoo (5, 'free' is a modifier), shared: shampoo = 1/5 = 0.2,
    # not > 0.2 but the query matches, so r_type = 1: (0 + 1 + 0) / 5
    obs = play(game, SEARCH, f"click[{P2L}]", "click[8 fl oz]", "click[buy now]")
    info = obs.info_dict()
    assert isclose(obs.reward, 1 / 5) and info["title_score"] == 0.2 and info["query_match"] == 1.0
    # the mouse (no pricing: 100.00): no noun shared with the goal title -> r_type 0, score 0
    game.reset("g1")
    obs = play(game, "search[wireless mouse]", f"click[{P4L}]", "click[buy now]")
    assert obs.reward == 0.0 and obs.info_dict()["r_type"] == 0.0


def test_options_are_dropped_when_leaving_for_the_results(game: WebShopGame) -> None:
    play(game, SEARCH, f"click[{P1L}]", "click[8 fl oz]", "click[lavender]")
    # a sub-page and back keeps the options
    obs = play(game, "click[reviews]", "click[< prev]", "click[buy now]")
    assert obs.reward == 1.0
    game.reset("g1")
    # back to the results and into the product again forgets them: (2 + 0 + 1) / 5
    obs = play(game, SEARCH, f"click[{P1L}]", "click[8 fl oz]", "click[lavender]", "click[< prev]",
               f"click[{P1L}]", "click[buy now]")
    assert isclose(obs.reward, 3 / 5)


@pytest.mark.parametrize("bad", [
    "click[buy now]",           # not on the search page
    "click[search]",            # the search button is never clickable
    "search[]",                 # empty argument: the pattern needs one character
    "Search[shampoo]",          # the action name is case-sensitive
    "buy",
    "",
    "click [shampoo]",
])
def test_invalid_actions_on_the_search_page_change_nothing(game: WebShopGame, bad: str) -> None:
    before = (game.step.__self__._s.page, game.admissible())  # type: ignore[attr-defined]
    obs = game.step(bad)
    assert not obs.valid and obs.reward == 0.0 and not obs.done
    assert obs.observation == f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"
    assert (game._s.page, game.admissible()) == before  # type: ignore[union-attr]
    assert "Invalid action" in str(obs.info_dict()["feedback"])
    assert game.step("search[shampoo]").valid


def test_invalid_actions_leave_the_episode_as_if_never_tried(catalog_dir: Path) -> None:
    script = [SEARCH, "click[next >]", "click[< prev]", f"click[{P1L}]", "click[8 fl oz]",
              "click[description]", "click[< prev]", "click[lavender]", "click[buy now]"]
    noise = ["search[tea tree]",  # no search bar after the first search
             "click[b0notthere]", "click[< prev ]", "click[]", "click[buy now]", "click[lavender]"]
    clean, noisy = WebShopGame(str(catalog_dir)), WebShopGame(str(catalog_dir))
    a, b = [clean.reset("g1")], [noisy.reset("g1")]
    for i, action in enumerate(script):
        if i > 0:
            for n in noise:
                if n in b[-1].admissible:  # "click[buy now]" / "click[lavender]" are valid on the item page
                    continue
                obs = noisy.step(n)
                assert not obs.valid, f"{n!r} was accepted on page {b[-1].info_dict()['page']}"
                assert obs.observation == b[-1].observation and obs.admissible == b[-1].admissible
        a.append(clean.step(action))
        b.append(noisy.step(action))
    assert [(o.observation, o.admissible, o.reward, o.done) for o in a] == \
           [(o.observation, o.admissible, o.reward, o.done) for o in b]
    assert a[-1].reward == 1.0


def test_click_argument_is_lower_cased_like_webshop(game: WebShopGame) -> None:
    obs = play(game, "search[Sulfate Free Tea Tree SHAMPOO]", f"click[{P1}]", "click[8 FL OZ]",
               "click[Lavender]", "click[Buy Now]")
    assert obs.reward == 1.0


def test_search_anywhere_mode(catalog_dir: Path) -> None:
    strict = WebShopGame(str(catalog_dir))
    strict.reset("g1")
    strict.step("search[shampoo]")
    obs = strict.step("search[wireless mouse]")
    assert not obs.valid and "no search bar" in str(obs.info_dict()["feedback"])
    loose = WebShopGame(str(catalog_dir), search_anywhere=True)
    loose.reset("g1")
    loose.step("search[shampoo]")
    obs = loose.step("search[wireless mouse]")
    assert obs.valid and f"click[{P4L}]" in obs.admissible


def test_pages_without_the_instruction(catalog_dir: Path) -> None:
    g = WebShopGame(str(catalog_dir), show_instruction=False)
    assert g.reset("g1").observation == "WebShop [SEP] Search"
    obs = g.step(SEARCH)
    assert obs.observation.startswith("Back to Search [SEP] Page 1 (Total results: 13) [SEP] Next > [SEP] ")
    obs = play(g, f"click[{P1L}]", "click[description]")
    assert obs.observation == "Back to Search [SEP] < Prev [SEP] A gentle daily shampoo for every hair type."


def test_parse_action_like_webshop() -> None:
    assert parse_action("search[red shoes]") == ("search", "red shoes")
    assert parse_action("click[< Prev]") == ("click", "< Prev")
    assert parse_action("click[]") == ("click[]", None)
    assert parse_action("noop") == ("noop", None)


def test_lifecycle_errors(catalog_dir: Path) -> None:
    g = WebShopGame(str(catalog_dir))
    with pytest.raises(RuntimeError, match="reset"):
        g.step("search[x]")
    with pytest.raises(CatalogError, match="unknown goal id"):
        g.reset("nope")
    g.reset("g1")
    g.close()
    with pytest.raises(RuntimeError, match="reset"):
        g.step("search[x]")


def test_expert_on_every_shipped_goal() -> None:
    g = WebShopGame("tasks/webshop")
    scores = []
    for gid in g.catalog.goal_ids():
        obs = g.reset(gid)
        expert = WebShopExpert(g.goal)
        for _ in range(20):
            obs = g.step(expert.act(obs))
            if obs.done:
                break
        scores.append(obs.reward)
    assert len(scores) >= 500 and all(s == 1.0 for s in scores)
