"""WebShop (Yao et al., 2022) re-implemented as a text environment: pages, search[...] / click[...]
actions, WebShop's purchase reward, BM25 product search, and a catalog in WebShop's file schema
(loaded from the original files, or generated). `WebShopGame` implements the text-game protocol, so
it runs in-process or inside a sandbox through the shared text-game harness. Never imports torch."""

from swerl.envs.webshop.data import Catalog, CatalogError, Goal, OptionGroup, Product, Review, load_catalog
from swerl.envs.webshop.expert import WebShopExpert
from swerl.envs.webshop.game import WebShopGame, parse_action
from swerl.envs.webshop.generator import generate_catalog
from swerl.envs.webshop.reward import RewardBreakdown, purchase_reward
from swerl.envs.webshop.search import SearchEngine

__all__ = [
    "Catalog", "CatalogError", "Goal", "OptionGroup", "Product", "Review", "RewardBreakdown", "SearchEngine",
    "WebShopExpert", "WebShopGame", "generate_catalog", "load_catalog", "parse_action", "purchase_reward",
]
