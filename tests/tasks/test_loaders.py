"""Loaders (built-in sets, user files, datasets), prompt templates, and the registered math tasks."""

from __future__ import annotations

import json

import pytest

from oblr.tasks import get_task
from oblr.tasks.loaders import BENCHMARKS, data_dir, load_benchmark, load_file, load_hf_dataset
from oblr.tasks.templates import INSTRUCTIONS, render_prompt

EXPECTED_ROWS = {("gsm8k", "train"): 7473, ("gsm8k", "test"): 1319, ("math500", "test"): 500,
                 ("aime24", "test"): 30, ("aime25", "test"): 30, ("amc23", "test"): 40,
                 ("olympiadbench", "test"): 675, ("minerva_math", "test"): 272}


@pytest.mark.parametrize("name,split", list(EXPECTED_ROWS))
def test_every_builtin_set_loads(name, split):
    recs = load_benchmark(name, split)
    assert len(recs) == EXPECTED_ROWS[(name, split)] and recs.skipped == 0
    for r in recs:
        assert r.question.strip() and r.answer
        assert r.meta["benchmark"] == name and r.meta["kind"] == BENCHMARKS[name].kind and r.meta["line"] >= 1


def test_builtin_answers_as_expected():
    assert load_benchmark("gsm8k", "test", limit=1)[0].answer == "18"
    assert load_benchmark("aime25", limit=1)[0].answer == "70"  # the float 70.0 of the file
    assert load_benchmark("amc23", limit=1)[0].answer == "27"
    assert load_benchmark("minerva_math", limit=1)[0].answer == "1.6"  # last \boxed of the solution
    ob = load_benchmark("olympiadbench")
    assert all(isinstance(r.answer, list) for r in ob)
    assert sum(r.meta["unit"] is not None for r in ob) == 8
    assert sum(bool(r.meta["is_multiple_answer"]) for r in ob) == 94
    assert load_benchmark("math500", limit=2)[1].meta["subject"]


def test_data_dir_override(tmp_path, monkeypatch):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "x\n#### 2"}) + "\n")
    monkeypatch.setenv("OBLR_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    assert [r.answer for r in load_benchmark("gsm8k", "test")] == ["2"]
    with pytest.raises(FileNotFoundError, match="OBLR_DATA_DIR"):
        load_benchmark("math500")


def test_unknown_names():
    with pytest.raises(ValueError, match="unknown benchmark 'math5'.*math500"):
        load_benchmark("math5")
    with pytest.raises(ValueError, match="no split 'train'"):
        load_benchmark("math500", "train")


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_user_jsonl_with_field_mapping(tmp_path):
    p = _write(tmp_path / "d.jsonl", [{"q": "What is 1/2+1/2?", "a": "1", "sol": "so \\boxed{1}"},
                                      {"q": "2+2?", "a": 4, "sol": None}])
    recs = load_file(p, question="q", answer="a", solution="sol")
    assert [(r.question, r.answer, r.solution) for r in recs] == [("What is 1/2+1/2?", "1", "so \\boxed{1}"),
                                                                 ("2+2?", "4", None)]
    with pytest.warns(RuntimeWarning, match=r"d\.jsonl:2: field 'sol' is null"):
        boxed = load_file(p, question="q", answer="sol", answer_format="boxed", on_error="skip")
    assert [r.answer for r in boxed] == ["1"] and boxed.skipped == 1


@pytest.mark.parametrize("bad_line,message", [
    ('{"question": "x", "answer": ', "invalid JSON"),
    ('{"question": "x"}', "missing field 'answer'"),
    ('{"question": "  ", "answer": "1"}', "not a non-empty string"),
    ('{"question": "x", "answer": ""}', "answer is empty"),
    ('[1, 2]', "expected a JSON object"),
])
def test_malformed_row_names_file_and_line(tmp_path, bad_line, message):
    p = _write(tmp_path / "bad.jsonl", [{"question": "a", "answer": "1"}, "", bad_line, {"question": "b", "answer": "2"}])
    with pytest.raises(ValueError, match=rf"bad\.jsonl:3: .*{message}"):
        load_file(p)
    with pytest.warns(RuntimeWarning, match="skipped 1 malformed"):
        recs = load_file(p, on_error="skip")
    assert [r.answer for r in recs] == ["1", "2"] and recs.skipped == 1 and "bad.jsonl:3" in recs.errors[0]
    assert [r.meta["line"] for r in recs] == [1, 4]


def test_gsm8k_format_error(tmp_path):
    p = _write(tmp_path / "g.jsonl", [{"question": "a", "answer": "no marker"}])
    with pytest.raises(ValueError, match=r"g\.jsonl:1: no '####'"):
        load_file(p, answer_format="gsm8k")
    with pytest.raises(ValueError, match="on_error must be"):
        load_file(p, on_error="ignore")


def test_parquet_and_json_array(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": ["p1", "p2"], "ans": ["\\frac12", None]}), tmp_path / "d.parquet")
    with pytest.raises(ValueError, match=r"d\.parquet:2: field 'ans' is null"):
        load_file(tmp_path / "d.parquet", question="problem", answer="ans")
    with pytest.warns(RuntimeWarning):
        recs = load_file(tmp_path / "d.parquet", question="problem", answer="ans", on_error="skip")
    assert [r.answer for r in recs] == ["\\frac12"]
    (tmp_path / "d.json").write_text(json.dumps([{"question": "q", "answer": 3.5}]))
    assert load_file(tmp_path / "d.json")[0].answer == "3.5"
    with pytest.raises(FileNotFoundError):
        load_file(tmp_path / "nope.jsonl")


def test_datasets_object_and_disk(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"prompt": ["a", "b", ""], "target": ["1", "2", "3"]})
    with pytest.raises(ValueError, match=r"\[train\]:3: field 'prompt'"):
        load_hf_dataset(ds, question="prompt", answer="target")
    ds.save_to_disk(str(tmp_path / "ds"))
    with pytest.warns(RuntimeWarning):
        recs = load_hf_dataset(str(tmp_path / "ds"), question="prompt", answer="target", on_error="skip", limit=5)
    assert [r.answer for r in recs] == ["1", "2"] and recs.skipped == 1
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "dd"))
    assert len(load_hf_dataset(str(tmp_path / "dd"), split="test", question="prompt", answer="target",
                               limit=2)) == 2


def _chat_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return tok


def test_templates():
    q = "What is 2+3?"
    base = render_prompt(q, kind="math", template="base")
    assert base == f"Question: {q}\n{INSTRUCTIONS['math']}\nAnswer:"
    assert "\\boxed{}" in INSTRUCTIONS["math"] and "####" in render_prompt(q, kind="gsm8k", template="base")
    tok = _chat_tokenizer()
    chat = render_prompt(q, kind="math", template="chat", tokenizer=tok, system="Be brief.")
    assert chat == f"<|system|>Be brief.<|end|><|user|>{q}\n{INSTRUCTIONS['math']}<|end|><|assistant|>"
    assert render_prompt(q, template="auto", tokenizer=tok) == render_prompt(q, template="chat", tokenizer=tok)
    assert render_prompt(q, template="auto", tokenizer=None) == base
    assert render_prompt(q, template="raw") == q
    with pytest.raises(ValueError, match="unknown prompt template"):
        render_prompt(q, template="fancy")


def test_chat_without_chat_template_falls_back(monkeypatch):
    import oblr.tasks.templates as t

    monkeypatch.setattr(t, "_warned_no_chat", False)
    with pytest.warns(RuntimeWarning, match="no chat template"):
        out = render_prompt("Q?", kind="gsm8k", template="chat", tokenizer=None)
    assert out == f"User: Q?\n{INSTRUCTIONS['gsm8k']}\nAssistant:"


def test_registered_tasks_and_rewards():
    t = get_task("gsm8k", template="base", limit=2, train_limit=3)
    assert (len(t.train), len(t.eval)) == (3, 2) and t.eval[0].answer == "18"
    assert t.reward("... #### 18", t.eval[0]) == 1.0 and t.reward("#### 19", t.eval[0]) == 0.0
    for name in ("math500", "aime24", "aime25", "amc23", "olympiadbench", "minerva_math"):
        task = get_task(name, template="base", limit=3)
        assert len(task.eval) == 3 and task.train == []
        ex = task.eval[0]
        assert ex.prompt.endswith("\\boxed{}.\nAnswer:") and ex.meta["kind"] == "math"
        assert task.reward(f"so \\boxed{{{ex.answer}}}", ex) == 1.0
        assert task.rewards([f"\\boxed{{{ex.answer}}}", "\\boxed{-123456}"], [ex, ex]) == [1.0, 0.0]


def test_math_data_task(tmp_path):
    p = _write(tmp_path / "train.jsonl", [{"problem": "x?", "sol": "w \\boxed{\\frac{1}{2}}"}] * 3)
    t = get_task("math_data", train=str(p), eval=str(p), question="problem", answer="sol",
                 answer_format="boxed", template="raw", limit=1)
    assert len(t.train) == 3 and len(t.eval) == 1 and t.train[0].prompt == "x?"
    assert t.reward("\\boxed{0.5}", t.train[0]) == 1.0
    with pytest.raises(ValueError, match="needs train="):
        get_task("math_data")


def test_a_datasets_failure_is_one_line_naming_the_source(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'org/name' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError) as e:
        load_hf_dataset("org/name")
    assert str(e.value) == ("org/name: cannot load it as a `datasets` dataset (ConnectionError: Couldn't reach "
                            "'org/name' on the Hub (LocalEntryNotFoundError))")
