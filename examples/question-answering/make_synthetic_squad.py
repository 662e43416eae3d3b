"""Generate a small SQuAD-shaped question-answering data set from template facts.

SQuAD cannot be downloaded where this project is tested, so the example and its tests run on data
made here, in the exact file layout SQuAD uses. Each paragraph introduces a few people and states
facts about them ("Alice was born in 1984.", "Bob works as a pilot."); each question asks for one
fact about one person ("When was Alice born?"). By default each kind of fact occurs once per
paragraph, which MiniLM learns to F1 > 90 in a few thousand samples; ``--repeat_fact_kinds`` makes
the kinds recur across people, so that only the name in the question picks the right span.
Answer offsets are recorded while the text is assembled and checked before anything is written.

Usage::

    python make_synthetic_squad.py --output_dir data/synthetic_squad            # nested SQuAD JSON
    python make_synthetic_squad.py --output_dir data/flat --layout flat          # HF flattened JSON Lines
    python make_synthetic_squad.py --output_dir data/v2 --unanswerable_fraction 0.3   # SQuAD v2-style

then ``run_qa.py --train_file data/synthetic_squad/train.json --validation_file
data/synthetic_squad/validation.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Formatter

from qa_data import flatten_squad, validate_qa_records

NAMES = (
    "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Karl Laura Mallory Nina Oscar Peggy "
    "Quentin Rupert Sybil Trent Ursula Victor Wendy Xavier Yara Zack"
).split()
CITIES = "Paris Rome Berlin Madrid Lisbon Oslo Vienna Athens Dublin Prague Warsaw Helsinki Zurich".split()
COUNTRIES = "France Italy Germany Spain Portugal Norway Austria Greece Ireland Poland Finland".split()
COLORS = "red green blue yellow purple orange black white brown pink".split()
JOBS = "teacher doctor pilot baker painter lawyer farmer engineer nurse writer chef architect".split()
PETS = "cat dog parrot rabbit horse turtle hamster goldfish".split()
PET_NAMES = "Max Luna Bella Charlie Milo Daisy Rocky Coco Oliver Ruby".split()
INSTRUMENTS = "piano guitar violin drums flute cello trumpet harp".split()


@dataclass(frozen=True)
class FactTemplate:
    """One kind of fact: a sentence with ``{person}`` and value slots, and questions per slot."""

    sentence: str
    questions: dict[str, tuple[str, ...]]
    values: dict[str, tuple[str, ...]]


FACTS = (
    FactTemplate("{person} was born in {year}.",
                 {"year": ("In what year was {person} born?", "When was {person} born?")},
                 {"year": tuple(str(y) for y in range(1940, 2011))}),
    FactTemplate("{person} lives in {city}.",
                 {"city": ("Where does {person} live?", "In which city does {person} live?")},
                 {"city": tuple(CITIES)}),
    FactTemplate("{person} works as a {job}.",
                 {"job": ("What is the job of {person}?", "What does {person} work as?")},
                 {"job": tuple(JOBS)}),
    FactTemplate("The favorite color of {person} is {color}.",
                 {"color": ("What is the favorite color of {person}?", "Which color does {person} like best?")},
                 {"color": tuple(COLORS)}),
    FactTemplate("{person} has a {pet} called {pet_name}.",
                 {"pet": ("What animal does {person} have?",), "pet_name": ("What is the name of {person}'s pet?",)},
                 {"pet": tuple(PETS), "pet_name": tuple(PET_NAMES)}),
    FactTemplate("{person} grew up in {country} and plays the {instrument}.",
                 {"country": ("In which country did {person} grow up?",),
                  "instrument": ("Which instrument does {person} play?",)},
                 {"country": tuple(COUNTRIES), "instrument": tuple(INSTRUMENTS)}),
)


def render(template: str, values: dict[str, str]) -> tuple[str, dict[str, int]]:
    """Fill ``template`` and return the text with the character offset of every filled slot."""
    parts, offsets, position = [], {}, 0
    for literal, field, _, _ in Formatter().parse(template):
        parts.append(literal)
        position += len(literal)
        if field is not None:
            offsets[field] = position
            parts.append(values[field])
            position += len(values[field])
    return "".join(parts), offsets


def make_paragraph(rng: random.Random, index: int, unanswerable_fraction: float,
                   repeat_fact_kinds: bool = False) -> dict:
    """One SQuAD paragraph: 2-3 people with 2-3 facts each, and one question per stated fact.

    Each person's facts are consecutive sentences (a short biography) in random order. By default
    each kind of fact (birth year, city, job, ...) is stated for one person only, so the question's
    relation picks the sentence and its name agrees with it. With ``repeat_fact_kinds`` kinds recur
    across people ("Ann lives in Oslo. ... Bob lives in Rome."), so only the name in the question
    tells the answers apart: a harder reading task that small models need many more steps for.

    With ``unanswerable_fraction`` > 0 some questions ask about a fact the paragraph does not state
    for that person (SQuAD v2's "impossible" questions): their ``answers`` list is empty.
    """
    people = rng.sample(NAMES, rng.randint(2, 3))
    if repeat_fact_kinds:
        kinds_of = [rng.sample(range(len(FACTS)), rng.randint(2, 3)) for _ in people]
    else:
        kinds = rng.sample(range(len(FACTS)), len(FACTS))
        per_person = len(FACTS) // len(people)
        kinds_of = [kinds[i * per_person:(i + 1) * per_person] for i in range(len(people))]
    sentences, pending, unstated = [], [], []
    for person, chosen in zip(people, kinds_of):
        unstated += [(person, FACTS[k]) for k in range(len(FACTS)) if k not in chosen]
        for k in chosen:
            fact = FACTS[k]
            values = {"person": person} | {slot: rng.choice(pool) for slot, pool in fact.values.items()}
            text, offsets = render(fact.sentence, values)
            sentences.append((text, offsets, values, fact))

    context, qas = "", []
    for text, offsets, values, fact in sentences:
        start = len(context) + (1 if context else 0)
        context = f"{context} {text}" if context else text
        for slot, templates in fact.questions.items():
            pending.append((rng.choice(templates).format(person=values["person"]),
                            values[slot], start + offsets[slot]))
    for n, (question, answer, answer_start) in enumerate(pending):
        qas.append({"id": f"syn{index:05d}q{n}", "question": question,
                    "answers": [{"text": answer, "answer_start": answer_start}]})
    if unanswerable_fraction > 0:
        impossible = round(len(qas) * unanswerable_fraction / (1 - unanswerable_fraction))
        for n in range(min(impossible, len(unstated))):
            person, fact = rng.choice(unstated)
            slot = rng.choice(list(fact.questions))
            qas.append({"id": f"syn{index:05d}u{n}", "question": rng.choice(fact.questions[slot]).format(person=person),
                        "answers": [], "is_impossible": True})
    rng.shuffle(qas)
    return {"context": context, "qas": qas}


def generate_squad(num_questions: int, seed: int = 0, unanswerable_fraction: float = 0.0,
                   repeat_fact_kinds: bool = False) -> dict:
    """A nested SQuAD document with at least ``num_questions`` questions, deterministic in ``seed``."""
    if not 0.0 <= unanswerable_fraction < 1.0:
        raise ValueError(f"unanswerable_fraction must be in [0, 1), got {unanswerable_fraction}.")
    rng = random.Random(seed)
    articles, count, index = [], 0, 0
    while count < num_questions:
        paragraphs = []
        for _ in range(5):  # five paragraphs per article, like a short SQuAD article
            paragraph = make_paragraph(rng, index, unanswerable_fraction, repeat_fact_kinds)
            index += 1
            paragraphs.append(paragraph)
            count += len(paragraph["qas"])
            if count >= num_questions:
                break
        articles.append({"title": f"Profiles_{len(articles):03d}", "paragraphs": paragraphs})
    version = "v2.0" if unanswerable_fraction > 0 else "1.1"
    return {"version": version, "data": articles}


def write_split(document: dict, path: Path, layout: str) -> Path:
    """Write ``document`` as nested SQuAD JSON (``squad``) or flattened JSON Lines (``flat``)."""
    records = flatten_squad(document)
    validate_qa_records(records, str(path))  # a generator bug must never reach a training run
    path.parent.mkdir(parents=True, exist_ok=True)
    if layout == "squad":
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    elif layout == "flat":
        with path.open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
    else:
        raise ValueError(f"layout must be 'squad' or 'flat', got {layout!r}.")
    return path


def make_dataset(output_dir: str | Path, train_questions: int = 2000, validation_questions: int = 300,
                 seed: int = 0, layout: str = "squad", unanswerable_fraction: float = 0.0,
                 repeat_fact_kinds: bool = False) -> dict[str, Path]:
    """Write ``train`` and ``validation`` files under ``output_dir``; return their paths by split."""
    suffix = ".json" if layout == "squad" else ".jsonl"
    output_dir = Path(output_dir)
    splits = {"train": (train_questions, seed), "validation": (validation_questions, seed + 1)}
    return {
        split: write_split(generate_squad(n, split_seed, unanswerable_fraction, repeat_fact_kinds),
                           output_dir / f"{split}{suffix}", layout)
        for split, (n, split_seed) in splits.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, help="folder for train.json(l) and validation.json(l)")
    parser.add_argument("--train_questions", type=int, default=2000)
    parser.add_argument("--validation_questions", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="train uses seed, validation seed + 1")
    parser.add_argument("--layout", choices=("squad", "flat"), default="squad",
                        help="squad: SQuAD's nested JSON; flat: the Hub's one-record-per-line layout")
    parser.add_argument("--unanswerable_fraction", type=float, default=0.0,
                        help="share of SQuAD v2-style questions without an answer (train with --version_2_with_negative)")
    parser.add_argument("--repeat_fact_kinds", action="store_true",
                        help="let kinds of fact recur across the people of a paragraph (harder: the name decides)")
    args = parser.parse_args(argv)
    paths = make_dataset(args.output_dir, args.train_questions, args.validation_questions, args.seed,
                         args.layout, args.unanswerable_fraction, args.repeat_fact_kinds)
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
