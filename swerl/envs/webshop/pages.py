"""WebShop's pages in its `text` observation mode: the visible texts of the page joined with ` [SEP] `,
and what can be clicked on it (the lower-cased text of every button and product link, and the value
of every option button).

    search page:  WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search
    results:      Instruction: [SEP] <instruction> [SEP] Back to Search [SEP] Page 2 (Total results: 50)
                  [SEP] < Prev [SEP] Next > [SEP] <asin> [SEP] <title> [SEP] <price> [SEP] ...
    item page:    Instruction: [SEP] ... [SEP] Back to Search [SEP] < Prev [SEP] <option name> [SEP]
                  <value> [SEP] ... [SEP] <title> [SEP] Price: <price> [SEP] Rating: <rating> [SEP]
                  Description [SEP] Features [SEP] Reviews [SEP] Buy Now
    sub pages:    Instruction: [SEP] ... [SEP] Back to Search [SEP] < Prev [SEP] <description | bullets |
                  "review title" [SEP] stars [SEP] review text ...>

As on WebShop, results always offer `Next >` (past the last result it shows an empty page), and
`< Prev` only from page 2 on. Empty texts are left out rather than shown as empty segments. Pages
rendered with instruction None leave out the two instruction texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swerl.envs.webshop.data import Product

SEP = " [SEP] "
BUY_NOW = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SEARCH_BUTTON = "Search"
SUB_PAGES = ("Description", "Features", "Reviews")
ATTRIBUTES_PAGE = "Attributes"
PRODUCTS_PER_PAGE = 10

INDEX, RESULTS, ITEM, SUB, DONE = "search", "results", "item", "item_sub", "done"


@dataclass(frozen=True)
class Page:
    """One rendered page."""

    kind: str
    """search | results | item | item_sub | done."""
    texts: tuple[str, ...]
    """The visible texts, in page order."""
    clickables: tuple[str, ...]
    """What `click[...]` accepts here, lower-cased buttons and links first, then option values."""
    has_search_bar: bool = False
    """Whether `search[...]` is on offer (the search page)."""

    @property
    def observation(self) -> str:
        return SEP.join(self.texts)

    def available_actions(self) -> dict[str, object]:
        """WebShop's `get_available_actions()`."""
        return {"has_search_bar": self.has_search_bar, "clickables": list(self.clickables)}


def _instruction(text: str | None) -> list[str]:
    return ["Instruction:", text] if text is not None else []


def _clean(texts: Sequence[str]) -> tuple[str, ...]:
    return tuple(t.strip() for t in texts if t.strip())


def _keys(*texts: str) -> tuple[str, ...]:
    # A dict keeps the first position of a repeated text, as WebShop's clickable dict does.
    return tuple(dict.fromkeys(t.lower() for t in texts))


def search_page(instruction: str | None) -> Page:
    return Page(INDEX, _clean(["WebShop", *_instruction(instruction), SEARCH_BUTTON]), _keys(SEARCH_BUTTON),
                has_search_bar=True)


def results_page(instruction: str | None, products: Sequence[Product], page: int, total: int) -> Page:
    buttons = [BACK_TO_SEARCH] + ([PREV_PAGE] if page > 1 else []) + [NEXT_PAGE]
    texts = [*_instruction(instruction), BACK_TO_SEARCH, f"Page {page} (Total results: {total})",
             *buttons[1:]]
    for p in products:
        texts += [p.asin, p.name, p.price_tag]
    return Page(RESULTS, _clean(texts), _keys(*buttons, *(p.asin for p in products)))


def item_page(instruction: str | None, product: Product, *, show_attrs: bool = False) -> Page:
    texts = [*_instruction(instruction), BACK_TO_SEARCH, PREV_PAGE]
    for g in product.options:
        texts += [g.name, *g.values]
    subs = [*SUB_PAGES, *([ATTRIBUTES_PAGE] if show_attrs else [])]
    texts += [product.name, f"Price: {product.price_tag}", f"Rating: {product.rating}", *subs, BUY_NOW]
    buttons = _keys(BACK_TO_SEARCH, PREV_PAGE, *subs, BUY_NOW)
    values = tuple(dict.fromkeys(v for g in product.options for v in g.values if v.lower() not in buttons))
    return Page(ITEM, _clean(texts), buttons + values)


def sub_page(instruction: str | None, product: Product, which: str) -> Page:
    texts = [*_instruction(instruction), BACK_TO_SEARCH, PREV_PAGE]
    if which == "Description":
        texts.append(product.description)
    elif which == "Features":
        texts += list(product.bullet_points)
    elif which == "Reviews":
        for r in product.reviews:
            texts += [f'"{r.title}"', str(r.score), r.body]
    elif which == ATTRIBUTES_PAGE:
        texts += list(product.attributes)
    else:
        raise ValueError(f"unknown item sub-page {which!r}; one of {(*SUB_PAGES, ATTRIBUTES_PAGE)}")
    return Page(SUB, _clean(texts), _keys(BACK_TO_SEARCH, PREV_PAGE))


def done_page(score: float) -> Page:
    return Page(DONE, ("Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{score}"), ())
