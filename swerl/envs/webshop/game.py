"""`WebShopGame`: WebShop's text environment behind the text-game protocol (reset / step / close).

    game = WebShopGame(catalog_dir="tasks/webshop")
    obs = game.reset("test-0003")          # the search page, with the goal's instruction
    obs = game.step("search[sulfate free shampoo]")
    obs = game.step("click[b0a1b2c3d4]")  # an asin from the results
    obs = game.step("click[16.9 fl oz]")  # an option
    obs = game.step("click[buy now]")     # done; obs.reward is the purchase score, obs.info its parts

Actions are parsed as WebShop parses them: `name[argument]`, the argument lower-cased; `search[...]`
with a non-empty argument runs a search (only where the page has a search bar, unless
`search_anywhere`, WebShop's own text env, which searches from any page); `click[x]` clicks `x` when
it is one of the page's clickables (never the search button itself). Anything else is invalid: the
state is unchanged and the observation says what is accepted. Navigation follows WebShop's server:
`back to search` starts over from the search page (forgetting the product and options), `< prev`
goes from a sub-page to the item page, from the item page to the results page (the chosen options
are dropped) and from results page n to n-1, `next >` to the next results page.

The constructor takes JSON-serialisable arguments only, so the same game runs in this process or
inside a sandbox behind the text-game server.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from swerl.envs.webshop import pages
from swerl.envs.webshop.data import Catalog, Goal, Product, cached_catalog
from swerl.envs.webshop.reward import RewardBreakdown, purchase_reward
from swerl.envs.webshop.search import SearchEngine
from swerl.structs import GameObs

DEFAULT_CATALOG = "tasks/webshop"
SEARCH_PLACEHOLDER = "search[<your query>]"
_ACTION = re.compile(r"(.+)\[(.+)\]")
_REPO_ROOT = Path(__file__).resolve().parents[3]


def parse_action(action: str) -> tuple[str, str | None]:
    """WebShop's action parsing: `name[arg]` -> (name, arg); anything else -> (action, None)."""
    m = _ACTION.match(action)
    if m is None:
        return action, None
    return m.group(1), m.group(2)


def resolve_catalog_dir(catalog_dir: str) -> Path:
    """A relative catalog directory is looked up from the working directory, then from the repository root."""
    p = Path(catalog_dir)
    if p.is_absolute() or p.is_dir():
        return p
    alt = _REPO_ROOT / p
    return alt if alt.is_dir() else p


_ENGINES: dict[int, tuple[Catalog, SearchEngine]] = {}
_ENGINES_LOCK = threading.Lock()


def search_engine_for(catalog: Catalog) -> SearchEngine:
    """One search engine per loaded catalog, shared by the games of this process."""
    with _ENGINES_LOCK:
        hit = _ENGINES.get(id(catalog))
        if hit is not None and hit[0] is catalog:
            return hit[1]
        if len(_ENGINES) >= 8:
            _ENGINES.pop(next(iter(_ENGINES)))
        engine = SearchEngine(catalog.products)
        _ENGINES[id(catalog)] = (catalog, engine)  # holding the catalog keeps its id from being reused
        return engine


@dataclass
class _Session:
    """The state WebShop's server keeps per session."""

    goal: Goal
    page: pages.Page
    keywords: tuple[str, ...] | None = None
    page_no: int | None = None
    asin: str | None = None
    sub: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    visited: set[str] = field(default_factory=set)
    reward: RewardBreakdown | None = None


class WebShopGame:
    """WebShop in text mode (see the module docstring). One episode at a time; not thread-safe."""

    def __init__(self, catalog_dir: str = DEFAULT_CATALOG, *, human_goals: bool | None = None, seed: int = 0,
                 search_anywhere: bool = False, show_attrs: bool = False,
                 show_instruction: bool = True) -> None:
        """catalog_dir: a catalog directory (relative: to the working directory, else to the repository);
        human_goals / seed: how goals are built when it has no goals.json (see `data.load_catalog`);
        search_anywhere: accept search[...] on every page, as WebShop's own text env does;
        show_attrs: the item page offers WebShop's hidden Attributes sub-page;
        show_instruction: pages start with "Instruction: [SEP] <instruction>" as on WebShop (off when
        a prompt states the task once, as verl-agent's WebShop prompt does)."""
        self.catalog = cached_catalog(resolve_catalog_dir(catalog_dir), human_goals=human_goals, seed=seed)
        self.engine = search_engine_for(self.catalog)
        self.search_anywhere = search_anywhere
        self.show_attrs = show_attrs
        self.show_instruction = show_instruction
        self._s: _Session | None = None
        self._asins = {p.asin.lower(): p.asin for p in self.catalog.products}

    # ---- the protocol ------------------------------------------------------------------------------

    def reset(self, game_id: str) -> GameObs:
        """Start the episode of goal `game_id` on the search page."""
        goal = self.catalog.goal(game_id)
        self._s = _Session(goal=goal, page=pages.search_page(self._instr(goal)))
        return self._obs(info=(("goal_id", goal.goal_id), ("task", goal.instruction_text)))

    def step(self, action: str) -> GameObs:
        s = self._session()
        if s.reward is not None:
            raise RuntimeError("WebShopGame.step after the purchase: the episode is over; call "
                               "reset(game_id)")
        name, arg = parse_action(action)
        arg = arg.lower() if arg is not None else None
        if name == "search" and arg and (s.page.has_search_bar or self.search_anywhere):
            self._search(tuple(arg.split(" ")), 1)
        elif (name == "click" and arg is not None and arg in s.page.clickables
              and arg != pages.SEARCH_BUTTON.lower()):
            self._click(arg)
        else:
            return self._invalid(action)
        if s.reward is not None:
            r = s.reward
            return self._obs(reward=r.score, won=r.score == 1.0, done=True,
                             info=(("purchased_asin", s.asin or ""), ("goal_asin", s.goal.asin),
                                   ("price", self._product().price), *r.items()))
        return self._obs()

    def close(self) -> None:
        self._s = None

    # ---- WebShop's own views -------------------------------------------------------------------------

    def available_actions(self) -> dict[str, object]:
        """WebShop's `get_available_actions()`: has_search_bar and the clickables."""
        return self._session().page.available_actions()

    def admissible(self) -> tuple[str, ...]:
        """The actions on offer, written as the model should write them."""
        page = self._session().page
        out = [SEARCH_PLACEHOLDER] if page.has_search_bar else []
        out += [f"click[{c}]" for c in page.clickables if c != pages.SEARCH_BUTTON.lower()]
        return tuple(out)

    @property
    def goal(self) -> Goal:
        return self._session().goal

    # ---- internals ---------------------------------------------------------------------------------

    def _instr(self, goal: Goal | None = None) -> str | None:
        return (goal or self._session().goal).instruction_text if self.show_instruction else None

    def _session(self) -> _Session:
        if self._s is None:
            raise RuntimeError("WebShopGame: call reset(game_id) first")
        return self._s

    def _product(self) -> Product:
        s = self._session()
        assert s.asin is not None
        return self.catalog.by_asin[s.asin]

    def _obs(self, *, reward: float = 0.0, won: bool = False, done: bool = False, valid: bool = True,
             info: tuple[tuple[str, str | float], ...] = ()) -> GameObs:
        s = self._session()
        return GameObs(observation=s.page.observation, admissible=self.admissible(), reward=reward, won=won,
                       done=done, valid=valid, info=(("page", s.page.kind), *info))

    def _invalid(self, action: str) -> GameObs:
        s = self._session()
        name, arg = parse_action(action)
        if name == "search" and arg and not s.page.has_search_bar:
            why = "There is no search bar on this page; click[back to search] first."
        elif name == "click" and arg is not None:
            why = f"{arg.lower()!r} cannot be clicked on this page."
        elif name in ("search", "click"):
            why = f"{name}[...] needs a non-empty argument in brackets."
        else:
            why = "Actions are search[query] or click[element], written exactly so."
        feedback = f"Invalid action {action!r}: {why} Available actions: {', '.join(self.admissible())}."
        return self._obs(valid=False, info=(("feedback", feedback),))

    def _search(self, keywords: tuple[str, ...], page_no: int) -> None:
        s = self._session()
        s.keywords, s.page_no, s.asin, s.sub, s.options = keywords, page_no, None, None, {}
        hits = self.engine.search(" ".join(keywords))
        shown = hits[(page_no - 1) * pages.PRODUCTS_PER_PAGE: page_no * pages.PRODUCTS_PER_PAGE]
        s.page = pages.results_page(self._instr(), shown, page_no, len(hits))

    def _item(self) -> None:
        s = self._session()
        s.sub = None
        s.page = pages.item_page(self._instr(), self._product(), show_attrs=self.show_attrs)

    def _click(self, name: str) -> None:
        s = self._session()
        kind = s.page.kind
        subs = {x.lower(): x for x in (*pages.SUB_PAGES, pages.ATTRIBUTES_PAGE)}
        if name == pages.BUY_NOW.lower():
            product = self._product()
            s.reward = purchase_reward(product, s.goal, product.price, s.options)
            s.page = pages.done_page(s.reward.score)
        elif name == pages.BACK_TO_SEARCH.lower():
            self._s = _Session(goal=s.goal, page=pages.search_page(self._instr(s.goal)))
        elif name == pages.NEXT_PAGE.lower() and kind == pages.RESULTS:
            assert s.keywords is not None and s.page_no is not None
            self._search(s.keywords, s.page_no + 1)
        elif name == pages.PREV_PAGE.lower() and kind == pages.RESULTS:
            assert s.keywords is not None and s.page_no is not None
            self._search(s.keywords, s.page_no - 1)
        elif name == pages.PREV_PAGE.lower() and kind == pages.SUB:
            self._item()
        elif name == pages.PREV_PAGE.lower() and kind == pages.ITEM:
            assert s.keywords is not None and s.page_no is not None
            self._search(s.keywords, s.page_no)
        elif name in subs and kind == pages.ITEM:
            s.sub = subs[name]
            s.page = pages.sub_page(self._instr(), self._product(), s.sub)
        elif kind == pages.RESULTS:  # a product link
            s.asin = self._asins[name]
            s.visited.add(s.asin)
            self._item()
        else:  # an option value on the item page
            s.options[self._product().option_names()[name]] = name
            self._item()
