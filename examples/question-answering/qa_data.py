"""Reading question-answering data from local files, in either of the two layouts people have.

SQuAD is published as one nested JSON document (``{"version", "data": [{"title", "paragraphs":
[{"context", "qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}``), while the
Hugging Face Hub stores it flattened, one record per question with ``answers`` as
``{"text": [...], "answer_start": [...]}``. ``datasets.load_dataset("json", field="data")`` reads
the flattened layout only: on the nested one it yields a single ``paragraphs`` column and run_qa
fails much later with a confusing ``KeyError``. This module recognises both layouts (and JSON Lines),
flattens the nested one itself, and checks every answer against its context before any tokenisation,
so a broken file fails at load time with the question id and the fix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from datasets import Dataset, DatasetDict, Features, Sequence, Value

QA_FEATURES = Features(
    {
        "id": Value("string"),
        "title": Value("string"),
        "context": Value("string"),
        "question": Value("string"),
        "answers": Sequence({"text": Value("string"), "answer_start": Value("int32")}),
    }
)
"""The column types of the Hub's `squad` / `squad_v2` datasets, so local files look the same."""

_MAX_REPORTED = 5  # offending records quoted in an error message; the count covers the rest


def flatten_squad(document: dict) -> list[dict]:
    """Turn a nested SQuAD document into one record per question, in the Hub's flattened layout.

    Unanswerable SQuAD v2 questions (``"is_impossible": true``, empty ``answers``) become records
    with empty answer lists; ``plausible_answers`` are not answers and are dropped.
    """
    records = []
    for article in document["data"]:
        title = article.get("title", "")
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                records.append(
                    {
                        "id": str(qa["id"]),
                        "title": title,
                        "context": context,
                        "question": qa["question"],
                        "answers": {
                            "text": [a["text"] for a in answers],
                            "answer_start": [int(a["answer_start"]) for a in answers],
                        },
                    }
                )
    return records


def _is_nested_squad(document: object) -> bool:
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        return False
    first = document["data"][0] if document["data"] else {}
    return isinstance(first, dict) and "paragraphs" in first


def read_qa_file(path: str | os.PathLike) -> list[dict]:
    """Read one QA file into flattened records, whatever its layout.

    Accepted: nested SQuAD JSON; ``{"data": [flat records]}`` (the layout Hugging Face's run_qa
    expected with ``field="data"``); a JSON list of flat records; JSON Lines of flat records.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"QA data file {str(path)!r} does not exist.")
    text = path.read_text(encoding="utf-8")
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        # Not one JSON value: JSON Lines, one flat record per line.
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path} is neither a JSON document nor JSON Lines ({err}). Expected SQuAD's nested "
                "JSON layout or one flattened record per line."
            ) from None
    if _is_nested_squad(document):
        return flatten_squad(document)
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        return document["data"]
    if isinstance(document, list):
        return document
    if isinstance(document, dict) and ("context" in document or "question" in document):
        return [document]  # JSON Lines with a single line parses as one object
    raise ValueError(
        f"{path} is JSON but not a QA layout this script knows: expected SQuAD's "
        '{"version", "data": [{"title", "paragraphs": [...]}]}, {"data": [records]}, a list of '
        "records, or JSON Lines."
    )


def _normalise_record(record: dict, index: int, source: str) -> dict:
    missing = {"context", "question"} - record.keys()
    if missing:
        raise ValueError(
            f"{source}: record {index} lacks the column(s) {sorted(missing)} (it has {sorted(record)}); every "
            "record needs "
            "`id`, `context`, `question` and (except in a test file) `answers` = "
            "{'text': [...], 'answer_start': [...]}."
        )
    answers = record.get("answers") or {"text": [], "answer_start": []}
    if isinstance(answers, list):  # the nested per-answer layout inside an otherwise flat record
        answers = {"text": [a["text"] for a in answers], "answer_start": [a["answer_start"] for a in answers]}
    return {
        "id": str(record.get("id", index)),
        "title": record.get("title", "") or "",
        "context": record["context"],
        "question": record["question"],
        "answers": {"text": list(answers["text"]), "answer_start": [int(s) for s in answers["answer_start"]]},
    }


def find_misplaced_answers(records: Iterable[dict]) -> list[str]:
    """Describe every answer whose text is not at its ``answer_start`` in the record's context."""
    problems = []
    for record in records:
        answers = record["answers"]
        if len(answers["text"]) != len(answers["answer_start"]):
            problems.append(f"id {record['id']!r}: {len(answers['text'])} texts but "
                            f"{len(answers['answer_start'])} answer_start values")
            continue
        for text, start in zip(answers["text"], answers["answer_start"]):
            found = record["context"][start : start + len(text)]
            if found != text:
                where = record["context"].find(text)
                hint = f"it occurs at {where}" if where >= 0 else "it does not occur in the context"
                problems.append(f"id {record['id']!r}: answer {text!r} is not at answer_start={start} "
                                f"(found {found!r}; {hint})")
    return problems


TEXT_COLUMNS = ("question", "context")
"""The text a question-answering example is made of; neither may be empty."""


def find_empty_text(ids: Iterable, columns: dict[str, Iterable]) -> list[tuple[int, str]]:
    """``(row, description)`` of every record whose ``question`` or ``context`` is missing, not text, or blank.

    ``columns`` maps a column name to its values, in the order of ``ids``.
    """
    problems = []
    for row, (record_id, *values) in enumerate(zip(ids, *columns.values())):
        for column, value in zip(columns, values):
            if not isinstance(value, str) or not value.strip():
                problems.append((row, f"id {record_id!r}: {column} is {value!r}"))
    return problems


def describe_problems(problems: list[str]) -> str:
    """The first few problems, one a line, and how many more."""
    shown = "\n  ".join(problems[:_MAX_REPORTED])
    more = f"\n  ... and {len(problems) - _MAX_REPORTED} more" if len(problems) > _MAX_REPORTED else ""
    return f"\n  {shown}{more}"


def validate_qa_records(records: list[dict], source: str) -> None:
    """Raise a ``ValueError`` listing misplaced answers, with the fix, if there are any.

    The tokeniser maps answers to token positions by character offsets, so an answer that is not at
    its ``answer_start`` would silently train the model on the wrong span.
    """
    empty = find_empty_text([r["id"] for r in records], {c: [r[c] for r in records] for c in TEXT_COLUMNS})
    if empty:
        raise ValueError(
            f"{source}: {len(empty)} empty question or context text(s):{describe_problems([d for _, d in empty])}\nFix: every "
            "record needs a non-empty `question` and `context` string; fill them in or delete those records."
        )
    problems = find_misplaced_answers(records)
    if problems:
        raise ValueError(
            f"{source}: {len(problems)} answer(s) do not occur in their context at answer_start:"
            f"{describe_problems(problems)}\nFix: `answer_start` must be the character offset of the answer text in "
            "`context` (context[answer_start:answer_start + len(text)] == text). Correct the file, or "
            "regenerate synthetic data with make_synthetic_squad.py."
        )


def load_qa_file(path: str | os.PathLike) -> Dataset:
    """Read, flatten, validate and type one QA file as a `datasets.Dataset` (the Hub's squad columns)."""
    raw = read_qa_file(path)
    if not raw:
        raise ValueError(f"{path} holds no questions (0 records); give a SQuAD-format file with at least one "
                         "question (make_synthetic_squad.py writes one).")
    records = [_normalise_record(r, i, str(path)) for i, r in enumerate(raw)]
    validate_qa_records(records, str(path))
    return Dataset.from_list(records, features=QA_FEATURES)


def load_qa_files(files: dict[str, str | None]) -> DatasetDict:
    """Load a split name → file mapping (``None`` entries skipped) into a `DatasetDict`."""
    return DatasetDict({split: load_qa_file(path) for split, path in files.items() if path})
