"""A long document generated at run time with facts planted at random places, to measure whether a
summary of a document far longer than the model's context keeps what is in its middle and end as
well as what is in its start (map-reduce over sections can lose the parts it combines last, or
first). Pure: a seed in, pages and the planted facts out.

The pages are the running prose of a long services agreement and its schedules: numbered
clauses made from a set of ordinary contract sentences, so that no page stands out. Each planted
fact is one sentence with two distinctive terms (a made-up name and an amount or a code) that
occur nowhere else in the document; a summary *covers* a fact when it contains both
(``gold.fact_covered``). The facts are spread evenly over the thirds of the document, each at a
random page of its third.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from measure.evaluation.gold import KeyFact

PAGES = 150
FACTS_PER_THIRD = 4
WORDS_PER_PAGE = (280, 380)

_TOPICS = (
    "Services", "Service Levels", "Charges", "Invoicing", "Personnel", "Subcontracting", "Records", "Audit",
    "Confidentiality", "Data Protection", "Security", "Business Continuity", "Change Control", "Governance",
    "Intellectual Property", "Warranties", "Indemnities", "Liability", "Insurance", "Term", "Termination",
    "Exit Management", "Disputes", "Notices", "Assignment", "Force Majeure", "General",
)  # fmt: skip
_SENTENCES = (
    "The Supplier shall perform the Services with the skill, care and diligence expected of a competent provider.",
    "The Customer shall give the Supplier such access to its premises and systems as the Supplier reasonably needs.",
    "Each party shall appoint a representative who has authority to take decisions on its behalf under this clause.",
    "The representatives shall meet at least once in each quarter to review the performance of the Services.",
    "Any change to the scope of the Services shall be agreed in writing under the change control procedure.",
    "The Supplier shall keep complete and accurate records of the Services for at least six years.",
    "Nothing in this clause limits the rights of either party under any other provision of this Agreement.",
    "The Supplier shall comply with the Customer's policies as notified to it in writing from time to time.",
    "Where a service level is not met, the Supplier shall prepare a plan to correct the failure within ten days.",
    "The Customer may withhold any amount it disputes in good faith, giving reasons in writing.",
    "Each party shall bear its own costs in connection with the matters described in this clause.",
    "The Supplier shall ensure that its personnel are suitably qualified and have passed the required checks.",
    "Information that is already public, or that a party develops independently, is not confidential.",
    "The parties shall cooperate in good faith to resolve any difficulty that arises in the course of the Services.",
    "A notice is given when it is delivered by hand or two working days after it is sent by recorded post.",
    "The obligations in this clause continue after the end of this Agreement for as long as they are relevant.",
    "The Supplier shall notify the Customer promptly of any matter that may affect its ability to perform.",
    "No delay in exercising a right under this Agreement is a waiver of that right or of any other right.",
)
_NAMES = (
    "Aldermoor", "Brackwater", "Calloway", "Dunsfold", "Elmstead", "Fairlight", "Greywell", "Hartland", "Ivybridge",
    "Kestrelmere", "Larkhill", "Marlstone", "Northwick", "Oakhanger", "Pennock", "Quarrendon", "Rushmere",
    "Saltash", "Thornbury", "Upavon", "Wetherden", "Yarcombe",
)  # fmt: skip
_FACTS = (
    "The escrow agent for the source code is {name} Trust Limited, and the escrow fee is {amount} pounds a year.",
    "The Supplier's named security officer is Dr Ines {name}, who may be reached on extension {code}.",
    "The data centre used for disaster recovery is at the {name} Industrial Estate, site reference {code}.",
    "The retention payment of {amount} pounds is released only after the {name} acceptance test is passed.",
    "Disputes under this Agreement are referred first to the {name} Panel, whose fee is capped at {amount} pounds.",
    "The insurance policy required by this clause is policy number {code}, issued by {name} Mutual.",
)


@dataclass(frozen=True)
class PlantedFact:
    fact: KeyFact
    third: int  # 1, 2 or 3: where in the document it is


def build_long_document(
    *, seed: int, pages: int = PAGES, facts_per_third: int = FACTS_PER_THIRD
) -> tuple[str, list[str], list[PlantedFact]]:
    """(title, page texts, planted facts) for ``seed``; the same seed gives the same document."""
    if pages < 3:
        raise ValueError("a long document needs at least 3 pages, one for each third")
    facts_per_third = min(facts_per_third, pages // 3)
    rng = random.Random(seed)  # noqa: S311 - a test document, not a secret
    texts: list[list[str]] = []
    clause = 1
    for _ in range(pages):
        words, lines = 0, []
        target = rng.randint(*WORDS_PER_PAGE)
        while words < target:
            topic = _TOPICS[(clause - 1) % len(_TOPICS)]
            body = " ".join(rng.sample(_SENTENCES, 3))
            lines.append(f"{clause}. {topic}. {body}")
            words += len(lines[-1].split())
            clause += 1
        texts.append(lines)
    names = rng.sample(_NAMES, 3 * facts_per_third)
    planted: list[PlantedFact] = []
    for third in range(3):
        first, last = third * pages // 3, (third + 1) * pages // 3 - 1
        for page_index in sorted(rng.sample(range(first, last + 1), facts_per_third)):
            name = names[len(planted)]
            amount = f"{rng.randint(12, 98) * 1000:,}"
            code = f"{name[:2].upper()}-{rng.randint(1000, 9999)}"
            template = _FACTS[len(planted) % len(_FACTS)]
            sentence = template.format(name=name, amount=amount, code=code)
            second = amount if "{amount}" in template else code
            lines = texts[page_index]
            lines.insert(rng.randint(0, len(lines)), sentence)
            planted.append(PlantedFact(KeyFact(sentence, page_index + 1, ((name,), (second,))), third + 1))
    title = "Master Services Agreement and Schedules"
    page_texts = ["\n".join(lines) for lines in texts]
    page_texts[0] = f"{title}\n\n{page_texts[0]}"
    return title, page_texts, planted


def coverage_by_third(planted: list[PlantedFact], covered: list[bool]) -> dict[str, Any]:
    """Key-fact coverage overall and in each third, and the largest gap between two thirds."""
    by_third = {}
    for third in (1, 2, 3):
        hits = [c for p, c in zip(planted, covered, strict=True) if p.third == third]
        by_third[third] = round(sum(hits) / len(hits), 3) if hits else None
    values = [v for v in by_third.values() if v is not None]
    return {
        "facts": len(planted),
        "covered": sum(covered),
        "coverage": round(sum(covered) / len(covered), 3) if covered else None,
        "by_third": by_third,
        "largest_gap": round(max(values) - min(values), 3) if values else None,
    }
