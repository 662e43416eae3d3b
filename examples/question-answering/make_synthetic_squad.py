"""Generate a small SQuAD-shaped question-answering data set from template facts.

SQuAD cannot be downloaded where this project is tested, so the example and its tests run on data
made here, in the exact file layout SQuAD uses. Each paragraph introduces a few people and states
facts about them ("Alice was born in 1984.", "Bob works as a pilot."); each question asks for one
fact about one person ("When was Alice born?"). Answer offsets are recorded while the text is
assembled and checked before anything is written.

By default the data is hard enough that a small model trained for a few minutes ends well short of
a perfect score, so a regression in training numerics shows as a lower score:

- kinds of fact recur across the people of a paragraph ("Ann lives in Oslo. ... Bob lives in
  Rome."), so only the name in the question picks the right span;
- distractor sentences mention values of the same kinds without any person ("A festival in Rome drew
  visitors from Spain in 1975."), so the answer's type alone does not find it;
- facts and questions are paraphrased (several wordings each, picked at random), so the question's
  words do not simply repeat the sentence's.

``--easy`` gives the old, easy data (each kind of fact once per paragraph, one wording, no
distractors), which MiniLM learns to F1 100 in a few thousand samples.

Usage::

    python make_synthetic_squad.py --output_dir data/synthetic_squad            # nested SQuAD JSON
    python make_synthetic_squad.py --output_dir data/flat --layout flat          # HF flattened JSON Lines
    python make_synthetic_squad.py --output_dir data/v2 --unanswerable_fraction 0.3   # SQuAD v2-style
    python make_synthetic_squad.py --output_dir data/easy --easy                 # the easy variant

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
    """One kind of fact: its wordings (the first is the plain one), value slots and questions per slot.

    Every wording and question names ``{person}``; the first question of a slot is the plain one.
    """

    sentences: tuple[str, ...]
    questions: dict[str, tuple[str, ...]]
    values: dict[str, tuple[str, ...]]


FACTS = (
    FactTemplate(("{person} was born in {year}.", "In {year}, {person} was born.",
                  "The birth year of {person} is {year}."),
                 {"year": ("In what year was {person} born?", "When was {person} born?",
                           "Which year saw the birth of {person}?", "{person} was born in which year?")},
                 {"year": tuple(str(y) for y in range(1940, 2011))}),
    FactTemplate(("{person} lives in {city}.", "{person} has a home in {city}.",
                  "These days {person} resides in {city}."),
                 {"city": ("Where does {person} live?", "In which city does {person} live?",
                           "What city is home to {person}?", "{person} resides in which city?")},
                 {"city": tuple(CITIES)}),
    FactTemplate(("{person} works as a {job}.", "{person} earns a living as a {job}.",
                  "By profession, {person} is a {job}."),
                 {"job": ("What is the job of {person}?", "What does {person} work as?",
                          "What is the profession of {person}?", "How does {person} earn a living?")},
                 {"job": tuple(JOBS)}),
    FactTemplate(("The favorite color of {person} is {color}.", "{person} likes {color} more than any other color.",
                  "Of all colors, {person} prefers {color}."),
                 {"color": ("What is the favorite color of {person}?", "Which color does {person} like best?",
                            "What colour does {person} prefer?")},
                 {"color": tuple(COLORS)}),
    FactTemplate(("{person} has a {pet} called {pet_name}.", "{person} keeps a {pet} named {pet_name}.",
                  "{pet_name} is the {pet} that {person} owns."),
                 {"pet": ("What animal does {person} have?", "What kind of pet does {person} keep?",
                          "Which animal does {person} own?"),
                  "pet_name": ("What is the name of {person}'s pet?", "What is the pet of {person} called?",
                               "What name does the pet of {person} answer to?")},
                 {"pet": tuple(PETS), "pet_name": tuple(PET_NAMES)}),
    FactTemplate(("{person} grew up in {country} and plays the {instrument}.",
                  "Raised in {country}, {person} now plays the {instrument}.",
                  "{person} spent a childhood in {country} and took up the {instrument}."),
                 {"country": ("In which country did {person} grow up?", "Where was {person} raised?",
                              "What country did {person} spend a childhood in?"),
                  "instrument": ("Which instrument does {person} play?", "What does {person} play?",
                                 "Which instrument did {person} take up?")},
                 {"country": tuple(COUNTRIES), "instrument": tuple(INSTRUMENTS)}),
)

# Sentences about no one in particular that mention values of the facts' kinds: a model that only
# learned "the question asks for a year, take a year" picks these as often as the right one.
DISTRACTORS = (
    "A festival in {city} drew visitors from {country} in {year}.",
    "The {job} association holds its yearly meeting in {city}.",
    "A {color} {pet} called {pet_name} once won a prize in {city}.",
    "Music schools in {country} often start pupils on the {instrument}.",
    "In {year}, the {pet} was the most common pet in {country}.",
    "The town hall of {city} was painted {color} in {year}.",
    "Every {job} in {country} is said to own a {instrument}.",
)
_POOLS = {slot: pool for fact in FACTS for slot, pool in fact.values.items()}


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
                   repeat_fact_kinds: bool = True, distractors: int = 2, paraphrase: bool = True) -> dict:
    """One SQuAD paragraph: 2-3 people with 2-3 facts each, and one question per stated fact.

    Each person's facts are consecutive sentences (a short biography) in random order. With
    ``repeat_fact_kinds`` kinds (birth year, city, job, ...) recur across people, so only the name
    in the question tells the answers apart; without it each kind is stated for one person only,
    so the question's relation alone picks the sentence. ``distractors`` sentences without a person
    but with values of the same kinds go between the biographies. With ``paraphrase`` every
    sentence and question takes one of its kind's wordings at random; without it, the plain one.

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

    def wording(options: tuple[str, ...]) -> str:
        return rng.choice(options) if paraphrase else options[0]

    blocks, unstated = [], []  # blocks: lists of (text, offsets, values, fact or None)
    for person, chosen in zip(people, kinds_of):
        unstated += [(person, FACTS[k]) for k in range(len(FACTS)) if k not in chosen]
        block = []
        for k in chosen:
            fact = FACTS[k]
            values = {"person": person} | {slot: rng.choice(pool) for slot, pool in fact.values.items()}
            text, offsets = render(wording(fact.sentences), values)
            block.append((text, offsets, values, fact))
        blocks.append(block)
    for _ in range(distractors):  # each between two biographies, or before the first / after the last
        template = rng.choice(DISTRACTORS)
        # In the template's order, not a set's: a set of strings iterates in an order that changes with
        # every process's hash seed, and the values drawn for it would too.
        fields = list(dict.fromkeys(field for _, field, _, _ in Formatter().parse(template) if field))
        text, offsets = render(template, {slot: rng.choice(_POOLS[slot]) for slot in fields})
        blocks.insert(rng.randint(0, len(blocks)), [(text, offsets, {}, None)])

    context, pending, qas = "", [], []
    for text, offsets, values, fact in (sentence for block in blocks for sentence in block):
        start = len(context) + (1 if context else 0)
        context = f"{context} {text}" if context else text
        if fact is None:
            continue
        for slot, templates in fact.questions.items():
            pending.append((wording(templates).format(person=values["person"]), values[slot], start + offsets[slot]))
    for n, (question, answer, answer_start) in enumerate(pending):
        qas.append({"id": f"syn{index:05d}q{n}", "question": question,
                    "answers": [{"text": answer, "answer_start": answer_start}]})
    if unanswerable_fraction > 0:
        impossible = round(len(qas) * unanswerable_fraction / (1 - unanswerable_fraction))
        for n in range(min(impossible, len(unstated))):
            person, fact = rng.choice(unstated)
            slot = rng.choice(list(fact.questions))
            qas.append({"id": f"syn{index:05d}u{n}", "question": wording(fact.questions[slot]).format(person=person),
                        "answers": [], "is_impossible": True})
    rng.shuffle(qas)
    return {"context": context, "qas": qas}


def generate_squad(num_questions: int, seed: int = 0, unanswerable_fraction: float = 0.0,
                   repeat_fact_kinds: bool = True, distractors: int = 2, paraphrase: bool = True) -> dict:
    """A nested SQuAD document with at least ``num_questions`` questions, deterministic in ``seed``.

    ``repeat_fact_kinds``, ``distractors`` and ``paraphrase`` are the difficulty knobs of
    `make_paragraph`; the defaults are the hard data, ``(False, 0, False)`` the easy one.
    """
    if distractors < 0:
        raise ValueError(f"distractors must be >= 0, got {distractors}.")
    if not 0.0 <= unanswerable_fraction < 1.0:
        raise ValueError(f"unanswerable_fraction must be in [0, 1), got {unanswerable_fraction}.")
    rng = random.Random(seed)
    articles, count, index = [], 0, 0
    while count < num_questions:
        paragraphs = []
        for _ in range(5):  # five paragraphs per article, like a short SQuAD article
            paragraph = make_paragraph(rng, index, unanswerable_fraction, repeat_fact_kinds, distractors, paraphrase)
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
                 repeat_fact_kinds: bool = True, distractors: int = 2, paraphrase: bool = True) -> dict[str, Path]:
    """Write ``train`` and ``validation`` files under ``output_dir``; return their paths by split."""
    suffix = ".json" if layout == "squad" else ".jsonl"
    output_dir = Path(output_dir)
    splits = {"train": (train_questions, seed), "validation": (validation_questions, seed + 1)}
    return {
        split: write_split(generate_squad(n, split_seed, unanswerable_fraction, repeat_fact_kinds, distractors,
                                          paraphrase),
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
    parser.add_argument("--repeat_fact_kinds", action=argparse.BooleanOptionalAction, default=None,
                        help="let kinds of fact recur across the people of a paragraph, so the name decides "
                             "(default: on; off with --easy)")
    parser.add_argument("--distractors", type=int, default=None,
                        help="sentences per paragraph that mention values of the facts' kinds but no person "
                             "(default 2; 0 with --easy)")
    parser.add_argument("--paraphrase", action=argparse.BooleanOptionalAction, default=None,
                        help="several wordings per fact and question (default: on; off with --easy)")
    parser.add_argument("--easy", action="store_true",
                        help="the easy data: each kind of fact once per paragraph, one wording, no distractors "
                             "(flags given explicitly still win)")
    args = parser.parse_args(argv)
    hard = not args.easy
    repeat = hard if args.repeat_fact_kinds is None else args.repeat_fact_kinds
    distractors = (2 if hard else 0) if args.distractors is None else args.distractors
    paraphrase = hard if args.paraphrase is None else args.paraphrase
    if distractors < 0:
        parser.error(f"--distractors must be >= 0, got {distractors}")
    paths = make_dataset(args.output_dir, args.train_questions, args.validation_questions, args.seed,
                         args.layout, args.unanswerable_fraction, repeat, distractors, paraphrase)
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
