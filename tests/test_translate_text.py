"""The text command (translate/translate_text.py) and ensembles in translate/decoding/search.py."""

import hashlib
import json
import os
import pathlib
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import read_only

from translate import atomic, cli, evaluate, translate_text
from translate import trained as trained_module
from translate.data.batching import source_batches
from translate.data.tokenizer import train_tokenizer
from translate.decoding import saved_searches, sentences
from translate.decoding.search import beam_search, greedy_search
from translate.decoding.sentences import DecodeTimes, translate_sentences
from translate.decoding.settings import decode_settings
from translate.trained import load_ensemble, load_model
from translate.workdir import Workdir, read_config

ROOT = pathlib.Path(__file__).resolve().parent.parent

LINES = [
    "the small dog sees the cat .",
    "",
    "a man reads .",
    "   ",
    "the old woman who lives in the house gives the child a red apple .",
    "the cat sleeps .",
    "",
]


def run(tmp_path, lines, *flags, name="out.txt"):
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    target = tmp_path / name
    translate_text.main([f"--input={source}", f"--output={target}", *flags])
    return target.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.mark.slow  # 18 s on 2 cores
def test_translate_keeps_input_order_and_line_count(workdir, tmp_path, monkeypatch, varied_outputs):
    # Chunks of 3 lines: the order must survive chunking as well as length-sorted batches.
    monkeypatch.setattr(translate_text, "LINES_PER_CHUNK", 3)
    out = run(tmp_path, LINES, f"--workdir={workdir}", "--beam_size=1", "--batch_size=2")
    assert len(out) == len(LINES)
    graphdef, params, tokenizer, config, _ = trained_module.load_model(workdir)
    settings = decode_settings(config.decode, {"beam_size": 1, "batch_size": 1})
    for line, translation in zip(LINES, out):
        if not line.strip():
            assert translation == ""
        else:
            alone = translate_sentences(
                (graphdef,), (params,), tokenizer, [line], settings, config.data.max_len
            )
            assert translation == alone[0][0][1]
    assert len({translation for translation in out if translation}) > 2


def test_nbest_gives_n_distinct_hypotheses_in_score_order(workdir, tmp_path, varied_outputs):
    out = run(tmp_path, LINES, f"--workdir={workdir}", "--beam_size=4", "--nbest=3")
    by_line = {}
    for row in out:
        index, score, text = row.split("\t")
        by_line.setdefault(int(index), []).append((float(score), text))
    assert sorted(by_line) == list(range(len(LINES)))
    for index, hypotheses in by_line.items():
        if not LINES[index].strip():
            assert hypotheses == [(0.0, "")]
            continue
        assert len(hypotheses) == 3
        scores = [score for score, _ in hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert len({text for _, text in hypotheses}) == 3


@pytest.mark.slow  # 6.4 s on 2 cores; out of the default run
def test_nbest_matches_the_best_translation(workdir, tmp_path):
    best = run(tmp_path, LINES, f"--workdir={workdir}", "--beam_size=4", name="best.txt")
    nbest = run(tmp_path, LINES, f"--workdir={workdir}", "--beam_size=4", "--nbest=2")
    firsts = {}
    for row in nbest:
        index, _, text = row.split("\t")
        firsts.setdefault(int(index), text)
    assert [firsts[i] for i in range(len(LINES))] == best


@pytest.mark.slow  # 10-18 s; kept out of the default run's 10 minutes
def test_ensemble_of_two_copies_of_a_model_equals_that_model(workdir):
    graphdef, params, tokenizer, config, _ = load_model(workdir)
    src = jnp.asarray(next(source_batches(tokenizer, [s for s in LINES if s.strip()], 4, 32))[1])
    single = greedy_search((graphdef,), (params,), src, max_extra_len=8)
    for ensemble in [((graphdef, graphdef), (params, params))]:
        # Two copies average to the same log-probabilities, through the ensemble's own caches.
        ensembled = greedy_search(*ensemble, src, max_extra_len=8)
        for a, b in zip(single, ensembled):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        a = beam_search((graphdef,), (params,), src, beam_size=3, alpha=0.6, max_extra_len=8)
        b = beam_search(*ensemble, src, beam_size=3, alpha=0.6, max_extra_len=8)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_ensemble_of_two_workdirs_translates_every_line(workdir, tmp_path):
    out = run(tmp_path, LINES, f"--workdir={workdir}", f"--workdir={workdir}", "--step=3")
    assert len(out) == len(LINES)
    alone = run(tmp_path, LINES, f"--workdir={workdir}", "--step=3", name="alone.txt")
    assert out == alone


def test_ensemble_with_another_vocabulary_is_an_error_naming_both_workdirs(workdir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(workdir, other)
    train_tokenizer(
        (workdir / "data" / "train.en").read_text().splitlines(), 120, Workdir(other).vocab
    )
    with pytest.raises(ValueError, match="different vocabularies") as error:
        run(tmp_path, LINES, f"--workdir={workdir}", f"--workdir={other}")
    assert str(workdir) in str(error.value) and str(other) in str(error.value)
    with pytest.raises(ValueError, match="different vocabularies"):
        evaluate.main([f"--workdir={workdir}", f"--workdir={other}", "--src=x", "--ref=y"])


def test_checkpoint_flags_reject_what_they_cannot_read(workdir):
    with pytest.raises(ValueError, match=r"--average=3: .*holds only 2"):
        load_ensemble([workdir], average=3)
    with pytest.raises(ValueError, match="not both"):
        load_ensemble([workdir], step=3, average=2)
    with pytest.raises(ValueError, match="must be >= 0"):
        load_ensemble([workdir], average=-1)
    command_lines = [
        (translate_text.main, [f"--workdir={workdir}", "--average=3"]),
        (evaluate.main, [f"--workdir={workdir}", "--average=3", "--src=x", "--ref=y"]),
    ]
    for main, argv in command_lines:  # both commands choose checkpoints through load_ensemble
        with pytest.raises(ValueError, match=r"--average=3: .*holds only 2"):
            main(argv)


@pytest.mark.slow  # 12 s on 2 cores
def test_decoding_many_lengths_compiles_a_handful_of_shapes_and_times_them_apart(workdir):
    graphdef, params, tokenizer, config, _ = load_model(workdir)
    words = "the small dog sees the old cat in the red house".split()
    # 60 sentences of 1 to 60 words: 60 different lengths.
    sentences = [" ".join(words[i % len(words)] for i in range(n)) for n in range(1, 61)]
    times = DecodeTimes()
    translate_sentences(
        (graphdef,),
        (params,),
        tokenizer,
        sentences,
        decode_settings(config.decode, {"beam_size": 1, "batch_size": 4}),
        config.data.max_len,
        times=times,
    )
    widths = {width for _, width in times.shapes}
    assert len(widths) <= 6 and len(times.shapes) == len(widths)  # one batch size
    assert times.compile_seconds > 0 and times.decode_seconds > 0


@pytest.mark.slow  # 13 s on 2 cores
def test_batches_searched_at_once_give_what_one_at_a_time_gives(workdir, varied_outputs):
    graphdef, params, tokenizer, config, _ = trained_module.load_model(workdir)
    words = "the small dog sees the old cat in the red house".split()
    sentences = [
        " ".join(words[(i * 7 + j) % len(words)] for j in range(i % 9 + 1)) for i in range(23)
    ]
    sentences[5] = ""
    found, done = {}, {}
    for parallel in (1, 3):
        # 11 batches of 2 (23 - 1 blank)
        given = {"beam_size": 3, "batch_size": 2, "parallel_batches": parallel}
        done[parallel] = []
        found[parallel] = translate_sentences(
            (graphdef,),
            (params,),
            tokenizer,
            sentences,
            decode_settings(config.decode, given, nbest=3),
            config.data.max_len,
            on_batch=done[parallel].append,
        )
    assert found[3] == found[1]  # texts and scores, each sentence's n-best in order
    assert len({hypotheses[0][1] for hypotheses in found[1]}) > 5
    assert done[3] == done[1] == [2] * 11 + [1]  # batch by batch, then the blank sentence


@pytest.mark.slow  # 10 s on 2 cores (compiles a search of its own); out of the default run
def test_an_error_while_batches_are_searched_waits_only_for_those_in_flight(workdir, monkeypatch):
    graphdef, params, tokenizer, config, _ = load_model(workdir)
    settings = decode_settings(
        config.decode, {"beam_size": 1, "batch_size": 1, "parallel_batches": 2}
    )
    searched = []
    search = sentences.search

    def counted(graphdefs, params, src, *args, **kwargs):
        if np.any(src):  # not a compilation's batch of padding
            searched.append(src)
        return search(graphdefs, params, src, *args, **kwargs)

    def stop(count):
        raise KeyboardInterrupt

    monkeypatch.setattr(sentences, "search", counted)
    with pytest.raises(KeyboardInterrupt):
        translate_sentences(
            (graphdef,), (params,), tokenizer, LINES * 4, settings, 99, on_batch=stop
        )
    # The first batch's result was handed over; at most two more had been started.
    assert 1 <= len(searched) <= 3, len(searched)


def test_output_that_is_the_input_is_refused_before_anything_is_opened(
    workdir, tmp_path, monkeypatch
):
    source = tmp_path / "in.txt"
    text = "".join(line + "\n" for line in LINES)
    source.write_text(text, encoding="utf-8")
    (tmp_path / "link.txt").symlink_to(source)
    os.link(source, tmp_path / "hard.txt")
    monkeypatch.chdir(tmp_path)
    for given_input, given_output in [
        (str(source), str(source)),
        ("in.txt", "./in.txt"),
        (str(source), "in.txt"),
        ("in.txt", "link.txt"),
        ("link.txt", str(tmp_path / "nowhere" / ".." / "in.txt")),
        ("in.txt", "hard.txt"),
    ]:
        argv = [f"--workdir={workdir}", f"--input={given_input}", f"--output={given_output}"]
        with pytest.raises(SystemExit, match="same file") as error:
            translate_text.main(argv)
        assert f"--input={given_input}" in str(error.value)
        assert f"--output={given_output}" in str(error.value)
        assert source.read_text(encoding="utf-8") == text
    # `< in.txt --output=in.txt`: standard input reads the file that would be replaced.
    with open(source, encoding="utf-8") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(SystemExit, match="--output=in.txt is the file that standard input"):
            translate_text.main([f"--workdir={workdir}", "--output=in.txt"])
    assert source.read_text(encoding="utf-8") == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.txt", "in.txt", "link.txt"]


def test_output_onto_a_workdirs_own_files_is_refused(workdir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    source = tmp_path / "in.txt"
    source.write_text("the cat sleeps .\n", encoding="utf-8")
    run_files = Workdir(copy)
    step = next(p for p in run_files.checkpoints.iterdir() if p.is_dir())
    targets = [
        run_files.config,
        run_files.vocab,
        run_files.metrics,
        next(p for p in step.rglob("*") if p.is_file()),
        step / "new.txt",
        run_files.tokens / "new.txt",
    ]
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    for target in targets:
        # Named directly and as the second of an ensemble's workdirs.
        for workdirs in [[copy], [workdir, copy]]:
            argv = [f"--workdir={w}" for w in workdirs] + [f"--input={source}"]
            with pytest.raises(
                ValueError, match=f"--output={target} is a file of --workdir={copy}"
            ):
                translate_text.main([*argv, f"--output={target}"])
    with pytest.raises(ValueError, match=f"--output={copy} is a directory"):
        translate_text.main([f"--workdir={workdir}", f"--input={source}", f"--output={copy}"])
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def test_an_interrupted_translation_leaves_the_earlier_output_as_it_was(
    workdir, tmp_path, monkeypatch
):
    target = tmp_path / "out.txt"
    target.write_text("an earlier translation\n", encoding="utf-8")
    target.chmod(0o640)
    monkeypatch.setattr(translate_text, "LINES_PER_CHUNK", 3)
    decode = saved_searches.OpenedModels.translate
    calls = []

    def interrupted_at_the_second_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    monkeypatch.setattr(saved_searches.OpenedModels, "translate", interrupted_at_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, LINES, f"--workdir={workdir}", "--beam_size=1")
    assert target.read_text(encoding="utf-8") == "an earlier translation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temp file

    monkeypatch.setattr(saved_searches.OpenedModels, "translate", decode)
    (tmp_path / "via.txt").symlink_to(target)
    assert len(run(tmp_path, LINES, f"--workdir={workdir}", "--beam_size=1", name="via.txt")) == 7
    assert (tmp_path / "via.txt").is_symlink()  # written through the link, as open() would
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the replaced file's permissions
    run(tmp_path, LINES, f"--workdir={workdir}", "--beam_size=1", name="new.txt")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "new.txt", "out.txt", "via.txt"]


def test_file_input_is_read_in_full_chunks_for_sorted_batches(tmp_path):
    source = tmp_path / "in.txt"
    source.write_bytes(b"".join(b"line %d\n" % i for i in range(25)) + b"last, no line end")
    with open(source, "rb") as f:
        chunks = list(translate_text.read_chunks(f, "in.txt", 10))
    assert [len(c) for c in chunks] == [10, 10, 6]
    assert chunks[0][0] == "line 0" and chunks[-1][-1] == "last, no line end"


def test_a_pipe_gives_each_line_as_it_arrives_and_waiting_lines_together():
    read_end, write_end = os.pipe()
    with open(read_end, "rb", buffering=0) as reader, open(write_end, "wb", buffering=0) as writer:
        chunks = translate_text.read_chunks(reader, "<stdin>", 10)
        writer.write(b"one\n")
        assert next(chunks) == ["one"]  # before the pipe is closed
        writer.write(b"two\nthree\nfour\n")
        assert next(chunks) == ["two", "three", "four"]
        writer.write("f\u00fcnf\n".encode()[:2])  # half a line: nothing yet
        writer.write("f\u00fcnf\n".encode()[2:])
        assert next(chunks) == ["f\u00fcnf"]
        writer.close()
        assert list(chunks) == []


def test_interactive_translation_answers_a_line_before_the_input_ends(
    workdir, tmp_path, monkeypatch, varied_outputs
):
    """A pipe on both ends, as a terminal or another program would drive the command."""
    sentences = ["the small dog sees the cat .", "a man reads ."]
    expected = run(tmp_path, sentences, f"--workdir={workdir}")
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    monkeypatch.setattr(sys, "stdin", open(stdin_read, encoding="utf-8"))
    monkeypatch.setattr(sys, "stdout", open(stdout_write, "w", encoding="utf-8"))
    errors = []

    def command():
        try:
            translate_text.main([f"--workdir={workdir}"])
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)
        finally:
            sys.stdout.close()

    thread = threading.Thread(target=command)
    thread.start()
    answers = []
    with open(stdin_write, "wb", buffering=0) as user, open(stdout_read, "rb") as screen:
        for sentence in sentences:
            user.write(sentence.encode() + b"\n")
            ready, _, _ = select.select([screen], [], [], 120)
            assert ready, "no translation within 120 s of writing the line"
            answers.append(screen.readline().decode().rstrip("\n"))
            assert thread.is_alive() and not errors  # still reading: stdin is open
    thread.join(60)
    assert not errors, errors
    assert answers == expected


def test_evaluate_writes_its_own_report_and_never_the_training_runs(workdir, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(workdir, run_dir)
    training_report = {
        p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and "report" in p.name
    }
    training_report["hypotheses.txt"] = (run_dir / "hypotheses.txt").read_bytes()
    (tmp_path / "test.en").write_text("the cat sleeps .\na man reads .\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("die Katze schläft .\nein Mann liest .\n", encoding="utf-8")
    (tmp_path / "other.de").write_text("die Katze .\nein Mann liest .\n", encoding="utf-8")
    argv = [
        f"--workdir={run_dir}",
        f"--src={tmp_path / 'test.en'}",
        f"--ref={tmp_path / 'test.de'}",
        "--config.decode.beam_size=1",
    ]
    evaluate.main([*argv, "--lowercase", f"--compare={tmp_path / 'other.de'}"])
    evaluate.main(argv)
    for name, content in training_report.items():
        assert (run_dir / name).read_bytes() == content
    first, second = (
        run_dir / "evaluations" / "test.en.step6",
        run_dir / "evaluations" / "test.en.step6.2",
    )
    assert sorted(p.name for p in first.iterdir()) == [
        "hypotheses.txt",
        "report.json",
        "report.txt",
    ]
    assert (second / "report.json").is_file()
    report = json.loads((first / "report.json").read_text())
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert report["git"]["commit"] == head.stdout.strip()
    assert report["packages"]["jax"] == jax.__version__ and report["packages"]["python"]
    assert report["device"] == jax.local_devices()[0].device_kind
    assert report["config"]["decode"]["beam_size"] == 1
    assert report["config"]["model"] == read_config(Workdir(run_dir)).to_dict()["model"]
    assert report["num_parameters"][0] > 0
    for side, name in (("source", "test.en"), ("reference", "test.de")):
        digest = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        assert report["test_set"][f"{side}_sha256"] == digest
    assert {"bleu", "bleu_lowercase", "tokenized_bleu", "chrf"} <= set(report)
    assert (
        report["comparison"]["other_sha256"]
        == hashlib.sha256((tmp_path / "other.de").read_bytes()).hexdigest()
    )
    assert "paired bootstrap" in (first / "report.txt").read_text()
    with pytest.raises(ValueError, match=f"--output={run_dir} is --workdir={run_dir} itself"):
        evaluate.main([*argv, f"--output={run_dir}"])
    with pytest.raises(ValueError, match="holds report.json"):
        evaluate.main([*argv, f"--output={first}"])


def write_test_set(tmp_path, lines=("the cat sleeps .", "a man reads .")):
    (tmp_path / "test.en").write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    (tmp_path / "test.de").write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    return [f"--src={tmp_path / 'test.en'}", f"--ref={tmp_path / 'test.de'}"]


def test_evaluate_on_a_read_only_workdir_says_where_to_write_before_decoding(
    workdir, tmp_path, monkeypatch
):
    run_dir = tmp_path / "run"
    shutil.copytree(workdir, run_dir)
    test_set = write_test_set(tmp_path)
    decoded = []
    monkeypatch.setattr(evaluate, "translate_and_score", lambda *a, **k: decoded.append(1))
    with read_only(run_dir):
        with pytest.raises(ValueError, match=r"cannot write in .*run.*--output=DIR") as error:
            evaluate.main([f"--workdir={run_dir}", *test_set])
        assert cli.user_error_message(error.value) is not None
        with pytest.raises(ValueError, match=r"cannot write in .*run.*--output=DIR"):
            evaluate.main([f"--workdir={run_dir}", *test_set, "--average=2"])
    assert not decoded, "refused before decoding"


def test_evaluate_refuses_an_output_that_is_a_file_or_under_one(workdir, tmp_path):
    test_set = write_test_set(tmp_path)
    (tmp_path / "afile").write_text("mine")
    for output in (tmp_path / "afile", tmp_path / "afile" / "out"):
        with pytest.raises(ValueError, match=rf"--output={output}: .*afile is a file") as error:
            evaluate.main([f"--workdir={workdir}", *test_set, f"--output={output}"])
        assert cli.user_error_message(error.value) is not None
    assert (tmp_path / "afile").read_text() == "mine"


def test_evaluate_of_an_empty_test_set_is_an_error_naming_it(workdir, tmp_path):
    test_set = write_test_set(tmp_path, lines=())
    with pytest.raises(ValueError, match=r"--src=.*test\.en holds no sentence"):
        evaluate.main([f"--workdir={workdir}", *test_set])


def test_two_evaluations_never_write_one_report_over_the_other(workdir, tmp_path, monkeypatch):
    """Both given the same --output (or both the default): the second, started while the
    first decodes, is refused at once (or gets a directory of its own)."""
    test_set = write_test_set(tmp_path)
    output = tmp_path / "out"
    decode = evaluate.translate_and_score
    inner = []

    def second_evaluation_meanwhile(*args, **kwargs):
        if not inner:
            inner.append(1)
            with pytest.raises(ValueError, match=f"--output={output} is being written by"):
                evaluate.main([f"--workdir={workdir}", *test_set, f"--output={output}"])
        return decode(*args, **kwargs)

    monkeypatch.setattr(evaluate, "translate_and_score", second_evaluation_meanwhile)
    evaluate.main([f"--workdir={workdir}", *test_set, f"--output={output}"])
    assert inner and (output / "report.json").is_file()
    with pytest.raises(ValueError, match="holds report.json"):
        evaluate.main([f"--workdir={workdir}", *test_set, f"--output={output}"])

    run_dir = tmp_path / "run"
    shutil.copytree(workdir, run_dir)
    outputs = []

    def default_meanwhile(*args, **kwargs):
        if len(outputs) < 1:
            outputs.append("inner")
            evaluate.main([f"--workdir={run_dir}", *test_set])
        return decode(*args, **kwargs)

    monkeypatch.setattr(evaluate, "translate_and_score", default_meanwhile)
    evaluate.main([f"--workdir={run_dir}", *test_set])
    made = sorted(p.name for p in (run_dir / "evaluations").iterdir())
    assert made == ["test.en.step6", "test.en.step6.2"]
    assert all((run_dir / "evaluations" / name / "report.json").is_file() for name in made)


def test_output_onto_anything_a_workdir_holds_is_refused(workdir, tmp_path):
    """The training report, hypotheses, curves, best/ and evaluations/ too."""
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    (copy / "evaluations" / "test.en.step6").mkdir(parents=True)
    source = tmp_path / "in.txt"
    source.write_text("the cat sleeps .\n", encoding="utf-8")
    run_files = Workdir(copy)
    targets = [
        run_files.report_json,
        run_files.report_txt,
        run_files.hypotheses,
        run_files.metric_plot("loss"),
        run_files.best / "config.json",
        run_files.evaluations / "test.en.step6" / "report.json",
        run_files.data / "test.de",
        run_files.tensorboard / "new.txt",
    ]
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    for target in targets:
        argv = [f"--workdir={copy}", f"--input={source}", f"--output={target}"]
        with pytest.raises(ValueError, match=f"--output={target} is a file of --workdir={copy}"):
            translate_text.main(argv)
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--beam_size=-3", "--beam_size=-3: must be >= 1"),
        ("--nbest=-1", "--nbest=-1: must be >= 0"),
        ("--length_penalty=nan", "--length_penalty=nan: must be a finite number >= 0"),
        ("--length_penalty=inf", "--length_penalty=inf: must be a finite number >= 0"),
        ("--length_penalty=-0.5", "--length_penalty=-0.5: must be a finite number >= 0"),
        ("--batch_size=-2", "--batch_size=-2: must be >= 1"),
        ("--parallel_batches=-1", "--parallel_batches=-1: must be >= 1"),
        ("--max_extra_len=-5", "--max_extra_len=-5: must be in [0, 1024]"),
        ("--max_extra_len=100000", "--max_extra_len=100000: must be in [0, 1024]"),
        ("--beam_stop=early", "--beam_stop=early: must be 'exact' or 'finished'"),
    ],
)
def test_decoding_flags_out_of_range_are_refused_naming_them(workdir, flag, message, monkeypatch):
    loaded = []
    monkeypatch.setattr(saved_searches, "load_ensemble", lambda *a, **k: loaded.append(1))
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        translate_text.main([f"--workdir={workdir}", flag])
    assert cli.user_error_message(error.value) is not None and not loaded


def test_the_closing_warning_starts_a_line_of_its_own_after_the_progress_line(
    workdir, tmp_path, capsys
):
    too_long = " ".join(["the cat sleeps ."] * 40)
    run(tmp_path, [too_long] * 7, f"--workdir={workdir}", "--beam_size=1")
    err = capsys.readouterr().err
    assert "\nwarning: 7 lines in all were longer than data.max_len\n" in err


def test_translate_says_which_model_it_decodes_and_what_it_truncates(
    workdir, tmp_path, monkeypatch, capsys
):
    config = read_config(Workdir(workdir))
    too_long = " ".join(["the cat sleeps ."] * 40)
    run(tmp_path, ["the cat sleeps .", too_long], f"--workdir={workdir}", "--beam_size=1")
    err = capsys.readouterr().err
    assert f"decoding with the checkpoint of step 6 of {workdir}" in err
    assert f"line 2 is longer than data.max_len={config.data.max_len} tokens" in err
    # A run whose report decoded an average is told how to decode that same model.
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    config.decode.average_last = 2
    Workdir(copy).config.write_text(json.dumps(config.to_dict()))
    run(tmp_path, ["the cat sleeps ."], f"--workdir={copy}", "--beam_size=1")
    err = capsys.readouterr().err
    assert "the training report decoded the mean of the newest 2 (--average=2)" in err


def test_a_sigterm_leaves_no_temporary_output_and_a_killed_ones_is_cleaned_up(
    workdir, tmp_path, monkeypatch
):
    source = tmp_path / "in.txt"
    source.write_text("the cat sleeps .\n", encoding="utf-8")
    target = tmp_path / "out.txt"
    target.write_text("an earlier translation\n", encoding="utf-8")

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)

    def exit_now(status):
        raise SystemExit(status)

    monkeypatch.setattr(saved_searches.OpenedModels, "translate", terminated)
    monkeypatch.setattr(os, "_exit", exit_now)
    argv = [f"--workdir={workdir}", f"--input={source}", f"--output={target}"]
    with pytest.raises(SystemExit) as stopped:
        cli.run(translate_text.main, argv)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]
    assert target.read_text(encoding="utf-8") == "an earlier translation\n"

    # SIGKILL runs nothing: the next translation into that file removes what it left.
    left = tmp_path / ".out.txt.0123abcd.tmp"
    left.write_text("half a translation\n")
    monkeypatch.undo()
    monkeypatch.setattr(atomic, "STALE_SECONDS", 0.0)
    translate_text.main([*argv, "--beam_size=1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def test_an_input_or_output_that_cannot_be_used_is_named_before_the_model_loads(
    workdir, tmp_path, monkeypatch
):
    loaded = []
    monkeypatch.setattr(saved_searches, "load_ensemble", lambda *a, **k: loaded.append(1))
    for given, message in [(tmp_path, "a directory"), (tmp_path / "none.en", "no such file")]:
        with pytest.raises(ValueError, match=f"--input={given}: {message}"):
            translate_text.main([f"--workdir={workdir}", f"--input={given}"])
    assert not loaded
    monkeypatch.undo()
    source = tmp_path / "in.txt"
    source.write_text("the cat sleeps .\n", encoding="utf-8")
    closed = tmp_path / "closed"
    closed.mkdir()
    with read_only(closed), pytest.raises(ValueError, match="--output=.*cannot write there"):
        translate_text.main([f"--workdir={workdir}", f"--input={source}", f"--output={closed}/x"])
    with pytest.raises(IsADirectoryError, match="a directory, not a file of sentences"):
        evaluate.main([f"--workdir={workdir}", f"--src={tmp_path}", f"--ref={source}"])


def test_an_input_that_can_be_read_once_is_translated_whole_into_the_output(workdir, tmp_path):
    # `cat in.en | translate-text --input=/dev/stdin --output=out.de`: counting the lines for
    # the progress line used to read the pipe to its end, and an empty file replaced out.de.
    target = tmp_path / "out.txt"
    target.write_text("an earlier translation\n", encoding="utf-8")
    lines = "".join(f"{line}\n" for line in LINES)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "translate.translate_text",
            f"--workdir={workdir}",
            "--input=/dev/stdin",
            f"--output={target}",
            "--beam_size=1",
        ],
        input=lines,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert len(target.read_text(encoding="utf-8").split("\n")[:-1]) == len(LINES)


def test_beam_stop_flag_sets_the_stopping_rule_and_the_default_keeps_the_workdirs(workdir):
    config = read_config(Workdir(workdir))
    flags = {name: unset for name, unset in translate_text.UNSET.items()} | {"nbest": 0}
    given = translate_text.given_decoding_flags(flags)
    assert decode_settings(config.decode, given).beam_stop == "exact"  # the workdir's own
    given = translate_text.given_decoding_flags(flags | {"beam_stop": "finished"})
    assert decode_settings(config.decode, given).beam_stop == "finished"


@pytest.mark.slow  # a fresh process compiles the search for one row: 45 s on 2 cores
def test_at_a_terminal_the_command_says_it_waits_for_a_sentence(workdir):
    """Interactive mode at a terminal shows that it waits for a sentence."""
    import pty

    user, terminal = pty.openpty()
    command = subprocess.Popen(
        [sys.executable, "-m", "translate.translate_text", f"--workdir={workdir}"],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    os.close(terminal)
    try:
        said = b""
        while b"Ctrl-D ends" not in said:
            ready, _, _ = select.select([command.stderr], [], [], 300)
            assert ready, f"no prompt within 300 s: {said!r}"
            data = os.read(command.stderr.fileno(), 4096)  # not readline: no buffer ahead
            assert data, f"the command ended first: {said!r}"
            said += data
        assert said.endswith(b"type a sentence and press Enter to translate it; Ctrl-D ends\n")
        os.write(user, b"the cat sleeps .\n\x04")
        out, _ = command.communicate(timeout=300)
    finally:
        command.kill()
        os.close(user)
    assert command.returncode == 0 and out.count(b"\n") == 1


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--beam_size=0", "--beam_size=0: must be >= 1"),
        ("--batch_size=0", "--batch_size=0: must be >= 1"),
        ("--length_penalty=-1", "--length_penalty=-1.0: must be a finite number >= 0"),
        ("--max_extra_len=-1", "--max_extra_len=-1: must be in [0, 1024]"),
    ],
)
def test_a_decoding_flag_given_its_unset_value_is_refused_not_ignored(flag, expected):
    """--beam_size=0 is refused, not decoded with the workdir's beam of 4 (a new user's try)."""
    with pytest.raises(ValueError, match=re.escape(expected)):
        translate_text.main(["--workdir=/nonexistent", flag])


def test_a_workdir_that_does_not_exist_is_said_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        translate_text.main([f"--workdir={tmp_path / 'missing'}", "--input=/dev/null"])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="Linux's always-full device")
def test_an_output_device_that_is_full_is_named(workdir, tmp_path, varied_outputs):
    """--output=/dev/full names the output, not "No space left on device" alone."""
    source = tmp_path / "in.txt"
    source.write_text("the cat sleeps .\n", encoding="utf-8")
    with pytest.raises(OSError) as error:
        translate_text.main([f"--workdir={workdir}", f"--input={source}", "--output=/dev/full"])
    assert error.value.filename == "/dev/full" and error.value.errno == 28


@pytest.mark.slow  # four fresh commands: 40-80 s on 2 cores
def test_closed_or_broken_standard_streams_give_one_line_and_lose_no_output(workdir, tmp_path):
    """Closed stdout or stdin give one line, not AttributeError tracebacks; a stderr whose
    reader went away does not end the command before --output is written."""
    source = tmp_path / "in.txt"
    source.write_text("the cat sleeps .\n", encoding="utf-8")
    command = [sys.executable, "-m", "translate.translate_text", f"--workdir={workdir}"]

    def run_with(*args, **kwargs):
        return subprocess.run(
            [*command, *args], cwd=ROOT, capture_output=False, timeout=300, **kwargs
        )

    closed_out = run_with(f"--input={source}", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          preexec_fn=lambda: os.close(1))  # fmt: skip
    assert closed_out.returncode == 2
    assert b"standard output is closed: give --output=FILE" in closed_out.stderr
    closed_in = run_with(stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: os.close(0))  # fmt: skip
    assert closed_in.returncode == 2
    assert b"standard input is closed: give --input=FILE" in closed_in.stderr
    target = tmp_path / "out.txt"
    written = run_with(
        f"--input={source}",
        f"--output={target}",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: (os.close(1), os.close(2)),
    )
    assert written.returncode == 0 and target.read_text(encoding="utf-8").count("\n") == 1
    target.unlink()
    reader, writer = os.pipe()
    os.close(reader)  # stderr's reader went away before the command wrote to it
    gone = run_with(f"--input={source}", f"--output={target}", stdout=subprocess.DEVNULL,
                    stderr=writer)  # fmt: skip
    os.close(writer)
    assert gone.returncode == 0 and target.read_text(encoding="utf-8").count("\n") == 1


@pytest.mark.slow  # a fresh command each: 10-20 s on 2 cores
@pytest.mark.parametrize("module", ["translate.translate_text", "translate.score"])
def test_a_gone_reader_of_standard_output_ends_the_command_as_sigpipe_would(
    workdir, tmp_path, module
):
    """`... | head -1` once the reader has gone: no "Broken pipe" line, no traceback, the
    status of a process that SIGPIPE ended."""
    source = tmp_path / "in.txt"
    source.write_text("the cat sleeps .\n", encoding="utf-8")
    inputs = [f"--input={source}"]
    if module == "translate.score":
        inputs = [f"--src={source}", f"--tgt={source}"]
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [sys.executable, "-m", module, f"--workdir={workdir}", *inputs],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
    finally:
        os.close(writer)
    assert done.returncode == 128 + signal.SIGPIPE, done.stderr
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr


def test_a_prefix_outside_the_vocabulary_is_named_on_stderr_by_its_file_and_line(
    workdir, tmp_path, capsys
):
    """A --prefix line's characters outside the vocabulary are forced as <unk>, as tokenized;
    stderr says so in translate-sample's words, naming the prefix file and the line."""
    prefix = tmp_path / "prefix.txt"
    prefix.write_text("the\n\nthe Ω\n", encoding="utf-8")
    out = run(
        tmp_path,
        ["the cat sleeps .", "a man reads .", "the dog ."],
        f"--workdir={workdir}",
        "--beam_size=1",
        f"--prefix={prefix}",
    )
    assert len(out) == 3 and out[2].startswith("the  ⁇ ")  # SentencePiece spaces its "⁇"
    errors = [line for line in capsys.readouterr().err.splitlines() if "outside" in line]
    assert errors == [
        f"warning: --prefix={prefix} line 3 has characters outside the vocabulary: they are "
        "forced as <unk> and printed as ⁇"
    ]
