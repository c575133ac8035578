"""Product search: BM25 over the text WebShop indexes, as its Lucene index scores it.

WebShop indexes, per product, `title + description + first bullet + options` lower-cased (options
as `name: v1, v2, and name2: ...`) with Pyserini's defaults: Lucene's English analysis (possessive
's removed, Lucene's 33 English stop words dropped, Porter stemming) and BM25 with k1 = 0.9,
b = 0.4. Here bm25s's Lucene variant scores the same documents, tokenised by bm25s with the same stop
words and the original Porter stemmer (snowballstemmer's `porter`). A search returns up to 50
products that share at least one term with the query, best first, ties in catalog order (Lucene's
order for equal scores).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import bm25s
import numpy as np
import snowballstemmer

from swerl.envs.webshop.data import Product

SEARCH_RETURN_N = 50
"""Products a search returns (WebShop's SEARCH_RETURN_N)."""
K1 = 0.9
B = 0.4
# Lucene's EnglishAnalyzer stop words (ENGLISH_STOP_WORDS_SET).
LUCENE_STOPWORDS: tuple[str, ...] = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no",
    "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to",
    "was", "will", "with",
)
_TOKEN = r"(?u)\b\w+\b"
_POSSESSIVE = re.compile(r"'s\b")


def document_text(p: Product) -> str:
    """The text WebShop's index holds for a product."""
    option_text = ", and ".join(f"{g.name}: {', '.join(g.values)}" for g in p.options)
    first_bullet = p.bullet_points[0] if p.bullet_points else ""
    return " ".join([p.name, p.description, first_bullet, option_text]).lower()


class SearchEngine:
    """BM25 over a fixed list of products. Read-only after construction: safe to share between games."""

    def __init__(self, products: Sequence[Product]) -> None:
        self.products = tuple(products)
        self._stemmer = snowballstemmer.stemmer("porter")
        self._bm25 = bm25s.BM25(method="lucene", k1=K1, b=B)
        corpus = self.tokenize([document_text(p) for p in self.products])
        self._bm25.index(corpus, show_progress=False)
        self._vocab = set(self._bm25.vocab_dict)

    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        cleaned = [_POSSESSIVE.sub("", t.lower()) for t in texts]
        out = bm25s.tokenize(cleaned, lower=True, token_pattern=_TOKEN, stopwords=list(LUCENE_STOPWORDS),
                             stemmer=self._stemmer.stemWords, return_ids=False, show_progress=False)
        return [[w for w in doc if w] for doc in out]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every product for the query (0 where no query term occurs)."""
        terms = [t for t in self.tokenize([query])[0] if t in self._vocab]
        if not terms:
            return np.zeros(len(self.products), dtype=np.float32)
        return self._bm25.get_scores(terms)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[Product]:
        """The top `k` products with a positive score, best first, ties in catalog order."""
        s = self.scores(query)
        order = np.lexsort((np.arange(len(s)), -s))  # last key is primary: score desc, then index asc
        return [self.products[i] for i in order[:k] if s[i] > 0]
