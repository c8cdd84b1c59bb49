"""Parallel text read and checked: translate/data/text.py."""

import os
import threading

import pytest

from translate.data.text import ParallelText, read_lines, read_parallel, sample_sentences


def test_mismatched_parallel_files_name_both_files(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\n")
    with pytest.raises(ValueError, match=r"a\.en has 2 lines.*a\.de has 1"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_empty_line_is_an_error_naming_file_and_line(tmp_path):
    (tmp_path / "a.en").write_text("one\n\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    with pytest.raises(ValueError, match=r"a\.en:2: empty line"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_invalid_utf8_is_an_error_naming_file_and_line(tmp_path):
    (tmp_path / "a.en").write_bytes(b"one\ntwo\n")
    (tmp_path / "a.de").write_bytes(b"eins\nzw\xffei\n")
    with pytest.raises(ValueError, match=r"a\.de:2: not valid UTF-8"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_vocab_sample_is_seeded_and_drawn_from_both_languages():
    src = [f"en {i}" for i in range(1000)]
    tgt = [f"de {i}" for i in range(1000)]
    text = ParallelText.from_lists(src, tgt, "a")
    sample = sample_sentences(text, 300, seed=0)
    assert sample == sample_sentences(text, 300, seed=0) != sample_sentences(text, 300, seed=1)
    assert len(set(sample)) == 300
    assert 100 < sum(s.startswith("en") for s in sample) < 200
    assert sorted(sample_sentences(text, 5000, seed=0)) == sorted(src + tgt)


def test_nul_byte_is_an_error_naming_file_and_line(tmp_path):
    (tmp_path / "a.en").write_bytes(b"one\ntw\x00o\n")
    (tmp_path / "a.de").write_bytes(b"eins\nzwei\n")
    with pytest.raises(ValueError, match=r"a\.en:2: NUL byte"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_sentences_are_read_from_a_pipe_as_from_a_file(tmp_path):
    """`translate-evaluate --src=<(zcat test.en.gz)` reads a pipe as it reads a file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "w", encoding="utf-8") as f:
            f.write("ein Satz .\nzwei Sätze .\n")

    writer = threading.Thread(target=write)
    writer.start()
    assert read_lines(fifo) == ["ein Satz .", "zwei Sätze ."]
    writer.join()
