"""A folder of labelled contracts laid out like ``../shared/data/cuad-dev`` (``labels.json``,
``pdf/``, ``txt/``), and the model-independent *quote ceiling* on it: the share of the lawyers'
labelled clause spans that some quote candidate the appliance would offer the model matches
under CUAD's rule (word Jaccard >= 0.5). A model that always chose the best candidate could
reach it and no more, so it measures the reading of the document (extraction, unwrapping,
sentence cutting), not the model. Pure apart from reading the folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inference.clauses import quote_choices
from measure.evaluation.metrics import JACCARD_MATCH, Counts, words
from measure.intervals import percentile_bootstrap

# CUAD's entity categories hold short answers (a name, a date), not clauses: not quoted spans.
ENTITY_CATEGORIES = frozenset({"Document Name", "Parties", "Agreement Date", "Effective Date"})
LAYOUTS = ("pdf", "txt")
BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class LabelledContract:
    key: str
    files: dict[str, Path]  # layout ("pdf", "txt") -> the file of it that exists
    labels: dict[str, tuple[str, ...]]  # category -> the labelled spans

    def clause_spans(self) -> list[tuple[str, str]]:
        return [(c, s) for c, spans in self.labels.items() if c not in ENTITY_CATEGORIES for s in spans]


def load_contracts(folder: Path) -> list[LabelledContract]:
    """The contracts of ``folder``; a ValueError says what is missing or malformed."""
    path = folder / "labels.json"
    if not path.is_file():
        raise ValueError(f"{folder} has no labels.json (a list of {{id, labels: {{category: [span, ...]}}}})")
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read as JSON: {exc}") from exc
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a list of contracts")
    contracts = []
    for index, item in enumerate(items):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("id"), str)
            or not isinstance(item.get("labels"), dict)
        ):
            raise ValueError(f"{path}: entry {index} needs an 'id' and a 'labels' object")
        key = item["id"]
        files = {layout: folder / layout / f"{key}.{layout}" for layout in LAYOUTS}
        files = {layout: f for layout, f in files.items() if f.is_file()}
        if not files:
            raise ValueError(f"{folder}: contract {key} has neither pdf/{key}.pdf nor txt/{key}.txt")
        labels = {
            str(c): tuple(str(s) for s in spans) for c, spans in item["labels"].items() if isinstance(spans, list)
        }
        contracts.append(LabelledContract(key, files, labels))
    return contracts


def best_match(span: str, candidates: list[set[str]]) -> float:
    """The highest word Jaccard between a labelled span and any candidate's words."""
    mine = words(span)
    return max((len(mine & theirs) / len(mine | theirs) for theirs in candidates if mine | theirs), default=0.0)


def quote_ceiling(
    contracts: list[LabelledContract], pages_of: Callable[[LabelledContract], list[str]], *, seed: int = 0
) -> dict:
    """The share of labelled clause spans some candidate matches, with a bootstrap 95 % interval
    over contracts, overall and per category; ``pages_of`` reads a contract's pages (the real
    ingest's extraction)."""
    per_contract: list[tuple[int, int]] = []
    by_category: list[dict[str, tuple[int, int]]] = []  # each contract's (matched, spans) by category
    candidates_total = 0
    misses: list[dict] = []
    for contract in contracts:
        pages = pages_of(contract)
        candidates = quote_choices(list(enumerate(pages, 1)))
        candidates_total += len(candidates)
        sets = [words(c.text) for c in candidates]
        tally: dict[str, tuple[int, int]] = {}
        for category, span in contract.clause_spans():
            best = best_match(span, sets)
            hits, spans = tally.get(category, (0, 0))
            tally[category] = (hits + int(best >= JACCARD_MATCH), spans + 1)
            if best < JACCARD_MATCH and len(misses) < 20:
                misses.append({"contract": contract.key, "category": category, "best_jaccard": round(best, 2),
                               "span": span[:160]})  # fmt: skip
        by_category.append(tally)
        per_contract.append((sum(m for m, _ in tally.values()), sum(n for _, n in tally.values())))
    per_category = {}
    for category in sorted({c for tally in by_category for c in tally}):
        # Every contract is a unit, one without spans of the category as (0, 0): the same
        # resampling of contracts as the overall interval.
        units = [tally.get(category, (0, 0)) for tally in by_category]
        hits, spans = sum(m for m, _ in units), sum(n for _, n in units)
        per_category[category] = {"spans": spans, "matched": hits, "ceiling": round(hits / spans, 3),
                                  "interval": bootstrap_interval(units, seed=seed)}  # fmt: skip
    matched = sum(m for m, _ in per_contract)
    total = sum(t for _, t in per_contract)
    return {
        "contracts": len(contracts),
        "spans": total,
        "matched": matched,
        "ceiling": round(matched / total, 3) if total else None,
        "interval": bootstrap_interval(per_contract, seed=seed),
        "candidates_per_contract": round(candidates_total / len(contracts), 1) if contracts else None,
        "misses": misses,
        "per_category": per_category,
    }


def bootstrap_interval(per_unit: list[tuple[int, int]], *, seed: int = 0) -> list[float] | None:
    """A percentile bootstrap 95 % interval of sum(hits) / sum(totals), resampling the units (a
    sample whose totals are all 0 has no share and is left out of the percentiles)."""

    def share(sample: list[tuple[int, int]]) -> float | None:
        total = sum(t for _, t in sample)
        return sum(h for h, _ in sample) / total if total else None

    return bootstrap(per_unit, share, seed=seed)


def bootstrap(units: list, statistic: Callable[[list], float | None], *, seed: int = 0) -> list[float] | None:
    """A percentile bootstrap 95 % interval of ``statistic`` over resamplings of ``units`` (the
    contracts: a contract's clauses are not independent of each other). None for fewer than two."""
    if len(units) < 2:
        return None
    bounds = percentile_bootstrap(
        lambda rng: statistic([units[rng.randrange(len(units))] for _ in units]), resamples=BOOTSTRAP_SAMPLES, seed=seed
    )
    return None if bounds is None else [round(bounds[0], 3), round(bounds[1], 3)]


def clause_scores(per_contract: list[dict[str, Counts]], *, seed: int = 0) -> dict:
    """Precision, recall and F1 under CUAD's rule (``metrics.match_clauses``, per contract and
    category), micro-averaged over contracts, overall and per category, each with bootstrap 95 %
    intervals over contracts (the same resamplings of contracts throughout: a contract without a
    category counts zero for it). ``per_contract``: each contract's counts by category."""
    categories = sorted({category for contract in per_contract for category in contract})
    # Each contract's counts as (matched, predicted, labelled), overall and by category, worked
    # out once: a resample then only adds up a few tuples (37 categories, 2000 resamples).
    by_category = {
        category: [_as_tuple(contract.get(category, Counts())) for contract in per_contract] for category in categories
    }
    overall = [_as_tuple(_summed([_as_tuple(part) for part in contract.values()])) for contract in per_contract]

    def scored(units: list[tuple[int, int, int]]) -> dict:
        return {
            **_summed(units).as_dict(),
            "interval": {name: bootstrap(units, _statistic(name), seed=seed) for name in ("precision", "recall", "f1")},
        }

    return {**scored(overall), "per_category": {category: scored(by_category[category]) for category in categories}}


def _as_tuple(counts: Counts) -> tuple[int, int, int]:
    return counts.matched, counts.predicted, counts.labelled


def _summed(units: list[tuple[int, int, int]]) -> Counts:
    return Counts(*map(sum, zip(*units, strict=True))) if units else Counts()


def _statistic(name: str) -> Callable[[list], float | None]:
    """``Counts``' ``name`` (precision, recall, f1) of a sample's counts added up."""
    return lambda sample: getattr(_summed(sample), name)
