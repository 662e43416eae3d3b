"""Loading QA files in SQuAD's nested and the Hub's flat layouts, and the synthetic SQuAD generator."""

import json
import re

import pytest
from fixtures import QA_EXAMPLE_DIR, use_example, write_synthetic_squad

use_example(QA_EXAMPLE_DIR)
from make_synthetic_squad import FACTS, NAMES, generate_squad, render  # noqa: E402
from qa_data import find_misplaced_answers, flatten_squad, load_qa_file, read_qa_file  # noqa: E402

NESTED = {
    "version": "1.1",
    "data": [
        {
            "title": "T",
            "paragraphs": [
                {
                    "context": "Bob lives in Rome. Ann lives in Oslo.",
                    "qas": [
                        {
                            "id": "a",
                            "question": "Where does Ann live?",
                            "answers": [{"text": "Oslo", "answer_start": 32}],
                        },
                        {
                            "id": "b",
                            "question": "Where does Bob live?",
                            "answers": [{"text": "Rome", "answer_start": 13}],
                        },
                    ],
                }
            ],
        }
    ],
}


def test_nested_squad_is_flattened_to_the_hub_layout():
    records = flatten_squad(NESTED)
    assert [r["id"] for r in records] == ["a", "b"]
    assert records[0] == {
        "id": "a",
        "title": "T",
        "context": NESTED["data"][0]["paragraphs"][0]["context"],
        "question": "Where does Ann live?",
        "answers": {"text": ["Oslo"], "answer_start": [32]},
    }


@pytest.mark.parametrize("layout", ["nested", "data_field", "list", "jsonl"])
def test_every_layout_loads_to_the_same_dataset(tmp_path, layout):
    flat = flatten_squad(NESTED)
    path = tmp_path / "file.json"
    if layout == "nested":
        path.write_text(json.dumps(NESTED))
    elif layout == "data_field":
        path.write_text(json.dumps({"version": "x", "data": flat}))
    elif layout == "list":
        path.write_text(json.dumps(flat))
    else:
        path.write_text("\n".join(json.dumps(r) for r in flat))
    dataset = load_qa_file(path)
    assert dataset.column_names == ["id", "title", "context", "question", "answers"]
    assert dataset[1]["answers"] == {"text": ["Rome"], "answer_start": [13]}


def test_v2_impossible_questions_get_empty_answers():
    nested = json.loads(json.dumps(NESTED))
    nested["data"][0]["paragraphs"][0]["qas"].append(
        {
            "id": "c",
            "question": "Where does Eve live?",
            "answers": [],
            "is_impossible": True,
            "plausible_answers": [{"text": "Rome", "answer_start": 13}],
        }
    )
    assert flatten_squad(nested)[-1]["answers"] == {"text": [], "answer_start": []}


def test_an_answer_not_in_its_context_fails_with_the_id_and_the_fix(tmp_path):
    broken = json.loads(json.dumps(NESTED))
    broken["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 5
    broken["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["text"] = "Madrid"
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError) as error:
        load_qa_file(path)
    message = str(error.value)
    assert "2 answer(s) do not occur" in message and "id 'a'" in message and "id 'b'" in message
    assert "it occurs at 32" in message and "does not occur in the context" in message
    assert "answer_start` must be the character offset" in message


def test_unknown_json_shapes_and_missing_columns_are_explained(tmp_path):
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a QA layout"):
        read_qa_file(odd)
    no_question = tmp_path / "noq.jsonl"
    no_question.write_text(json.dumps({"id": "1", "context": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['question'\]"):
        load_qa_file(no_question)


def test_render_records_slot_offsets():
    text, offsets = render("{person} lives in {city}.", {"person": "Ann", "city": "Oslo"})
    assert (
        text == "Ann lives in Oslo." and text[offsets["city"] :].startswith("Oslo") and offsets["person"] == 0
    )


def test_generated_data_is_deterministic_valid_and_in_squad_layout(tmp_path):
    first, again = generate_squad(50, seed=3), generate_squad(50, seed=3)
    assert first == again
    records = flatten_squad(first)
    assert len(records) >= 50 and not find_misplaced_answers(records)
    assert first["version"] == "1.1" and set(first["data"][0]) == {"title", "paragraphs"}
    assert all(r["answers"]["text"] for r in records)
    # Questions name a person of their paragraph, so the model must read the question.
    for record in records:
        named = [n for n in NAMES if n in record["question"].replace("'s", " ").replace("?", " ").split()]
        assert len(named) == 1 and named[0] in record["context"], record["question"]


def test_generated_data_is_the_same_in_every_process(tmp_path):
    """Python gives each process its own string-hash seed: data drawn in the order of a set of strings
    changed from run to run (the README demo's scores with it). Two processes, two hash seeds, one file."""
    import os
    import subprocess
    import sys

    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from make_synthetic_squad import generate_squad; "
        "print(json.dumps(generate_squad(40, seed=5)))"
    )
    outputs = [
        subprocess.run([sys.executable, "-c", code, str(QA_EXAMPLE_DIR)], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout  # fmt: skip
        for seed in ("1", "2")
    ]
    assert outputs[0] == outputs[1] and json.loads(outputs[0]) == generate_squad(40, seed=5)


def test_generator_writes_both_layouts_and_v2_questions(tmp_path):
    nested = write_synthetic_squad(tmp_path / "n", 30, 10)
    flat = write_synthetic_squad(tmp_path / "f", 30, 10, layout="flat")
    assert nested["train"].suffix == ".json" and flat["train"].suffix == ".jsonl"
    assert load_qa_file(nested["train"])[:] == load_qa_file(flat["train"])[:]
    v2 = load_qa_file(write_synthetic_squad(tmp_path / "v2", 60, 10, unanswerable_fraction=0.3)["train"])
    empty = sum(1 for a in v2["answers"] if not a["text"])
    assert 0.15 * len(v2) < empty < 0.45 * len(v2)


def _paragraphs(document):
    return [paragraph for article in document["data"] for paragraph in article["paragraphs"]]


def _answers(paragraph):
    """The answer texts of a paragraph's questions."""
    return [q["answers"][0]["text"] for q in paragraph["qas"]]


def test_fact_kinds_recur_by_default_and_are_unique_per_paragraph_in_the_easy_data():
    def kinds(paragraph):
        # The pool an answer comes from names its kind (the pools of the facts do not overlap).
        pools = {slot: set(pool) for fact in FACTS for slot, pool in fact.values.items()}
        return [
            next(slot for slot, pool in pools.items() if answer in pool) for answer in _answers(paragraph)
        ]

    def repeats(document):
        return any(len(k) != len(set(k)) for k in map(kinds, _paragraphs(document)))

    easy = generate_squad(200, seed=0, repeat_fact_kinds=False, distractors=0, paraphrase=False)
    assert not repeats(easy)
    assert repeats(generate_squad(200, seed=0))


def test_distractor_sentences_mention_no_person_and_only_the_hard_data_has_them():
    def person_free_sentences(paragraph):
        return sum(
            1
            for sentence in paragraph["context"].split(". ")
            if not any(n in sentence.split() for n in NAMES)
        )

    for distractors in (0, 2, 5):
        document = (
            generate_squad(200, seed=0)
            if distractors == 2
            else generate_squad(200, 0, distractors=distractors)
        )
        assert {person_free_sentences(p) for p in _paragraphs(document)} == {distractors}
    paragraphs = _paragraphs(generate_squad(200, seed=0))
    # Answers never come from a distractor: each answer's sentence names the question's person.
    for paragraph in paragraphs:
        for q in paragraph["qas"]:
            start = q["answers"][0]["answer_start"]
            sentence = paragraph["context"][paragraph["context"].rfind(". ", 0, start) + 1 :].split(". ")[0]
            person = next(n for n in NAMES if n in q["question"].replace("'s", " ").replace("?", " ").split())
            assert person in sentence.split(), (q["question"], sentence)


def test_paraphrases_vary_the_wording_and_the_easy_data_uses_one():
    name = re.compile(r"\b(" + "|".join(NAMES) + r")\b")

    def question_wordings(document):
        return {name.sub("X", q["question"]) for paragraph in _paragraphs(document) for q in paragraph["qas"]}

    plain = {q.replace("{person}", "X") for fact in FACTS for qs in fact.questions.values() for q in qs[:1]}
    easy = generate_squad(300, seed=0, repeat_fact_kinds=False, distractors=0, paraphrase=False)
    assert question_wordings(easy) == plain
    assert len(question_wordings(generate_squad(300, seed=0))) > 2 * len(plain)


def test_command_line_easy_switch_and_explicit_knobs(tmp_path):
    from make_synthetic_squad import main

    assert (
        main(
            [
                "--output_dir",
                str(tmp_path / "easy"),
                "--train_questions",
                "40",
                "--validation_questions",
                "10",
                "--easy",
            ]
        )
        == 0
    )
    easy = json.loads((tmp_path / "easy" / "train.json").read_text())
    assert easy == generate_squad(40, 0, repeat_fact_kinds=False, distractors=0, paraphrase=False)
    assert (
        main(
            [
                "--output_dir",
                str(tmp_path / "mixed"),
                "--train_questions",
                "40",
                "--validation_questions",
                "10",
                "--easy",
                "--distractors",
                "3",
            ]
        )
        == 0
    )
    mixed = json.loads((tmp_path / "mixed" / "train.json").read_text())
    assert mixed == generate_squad(40, 0, repeat_fact_kinds=False, distractors=3, paraphrase=False)
    assert json.loads((tmp_path / "mixed" / "validation.json").read_text()) == generate_squad(
        10, 1, repeat_fact_kinds=False, distractors=3, paraphrase=False
    )
