"""The report of a test set (translate/decoding/report.py): what it says and what produced it."""

import json

from translate.decoding import metrics
from translate.decoding import report as report_module


def a_report(**provenance) -> dict:
    hypotheses, references = ["die Katze schläft ."], ["die Katze schläft ."]
    report = metrics.score(hypotheses, references, "de")
    report.update(
        num_sentences=1,
        decode_seconds=0.5,
        compile_seconds=1.0,
        num_batch_shapes=1,
        sentences_per_second=2.0,
        beam_size=4,
        length_penalty=0.6,
        max_extra_len=50,
        step=6,
        checkpoint_steps=[6],
        device="cpu",
        packages={"jax": "0", "flax": "0", "sacrebleu": "0"},
        num_parameters=[100],
        **provenance,
    )
    return report


def test_a_report_outside_a_git_checkout_is_written_and_says_so(tmp_path, monkeypatch):
    """`pip install .` gives no git checkout: git_commit() is None and the report is written."""
    monkeypatch.setattr(report_module, "git_commit", lambda: None)
    report = a_report(git=report_module.git_commit())
    report_module.write_report(tmp_path, report, ["the cat sleeps ."], ["x"], ["y"])
    assert json.loads((tmp_path / "report.json").read_text())["git"] is None
    assert "code      not a git checkout;" in (tmp_path / "report.txt").read_text()


def test_a_report_names_the_commit_it_was_made_at(tmp_path):
    report = a_report(git={"commit": "0123456789abcdef", "modified": True})
    report_module.write_report(tmp_path, report, ["the cat sleeps ."], ["x"], ["y"])
    assert "code      commit 0123456789ab (modified);" in (tmp_path / "report.txt").read_text()


def test_report_txt_says_the_beam_stopping_rule_and_an_old_report_stopped_exactly(tmp_path):
    for name in ("new", "old", "greedy"):
        (tmp_path / name).mkdir()
    report = a_report(git=None, beam_stop="finished")
    report_module.write_report(tmp_path / "new", report, ["the cat sleeps ."], ["x"], ["y"])
    text = (tmp_path / "new" / "report.txt").read_text()
    assert "decoding  beam 4, length penalty 0.6, stop finished, at most" in text
    old = a_report(git=None)  # written before beam_stop was recorded
    report_module.write_report(tmp_path / "old", old, ["the cat sleeps ."], ["x"], ["y"])
    assert "stop exact, at most" in (tmp_path / "old" / "report.txt").read_text()
    greedy = a_report(git=None) | {"beam_size": 1}
    report_module.write_report(tmp_path / "greedy", greedy, ["the cat sleeps ."], ["x"], ["y"])
    assert (
        "decoding  beam 1, length penalty 0.6, at most"
        in (tmp_path / "greedy" / "report.txt").read_text()
    )


def test_a_report_names_the_machine_it_decoded_on(tmp_path):
    """The processor and CPU count: a CPU run rounds, and so trains and scores, by them."""
    facts = report_module.host()
    assert facts["cpu"] and facts["cpus"] >= 1
    report = a_report(git=None, host={"cpu": "Some CPU(R) 9000", "cpus": 2})
    report_module.write_report(tmp_path, report, ["the cat sleeps ."], ["x"], ["y"])
    text = (tmp_path / "report.txt").read_text()
    assert "sentences in 0.5 s on cpu (Some CPU(R) 9000, 2 CPUs); compiling" in text
    older = a_report(git=None)  # written before the host was recorded
    report_module.write_report(tmp_path, older, ["the cat sleeps ."], ["x"], ["y"])
    assert "sentences in 0.5 s on cpu; compiling" in (tmp_path / "report.txt").read_text()
