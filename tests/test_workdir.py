"""A run directory, and the one check of where a command may write (translate/workdir.py)."""

import json

import pytest

from translate.workdir import EXPORT_MARKER, Workdir, check_output_path


@pytest.fixture
def run(tmp_path):
    """A workdir as training leaves it, in outline: config, vocabulary, a checkpoint, a report."""
    workdir = Workdir(tmp_path / "run")
    (workdir.checkpoints / "6").mkdir(parents=True)
    workdir.config.write_text("{}\n")
    workdir.vocab.write_bytes(b"vocab")
    workdir.report_json.write_text(json.dumps({"bleu": 1.0}))
    (workdir.evaluations / "test.en.step6").mkdir(parents=True)
    (workdir.evaluations / "test.en.step6" / "report.json").write_text("{}")
    return workdir


def files_of(path):
    return {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("directory", [False, True])
def test_a_workdir_and_a_directory_holding_it_are_refused_for_every_output(run, directory):
    before = files_of(run.path)
    for output in (run.path, run.path.parent):
        with pytest.raises(ValueError, match=f"--output={output} is --workdir={run.path} itself"):
            check_output_path(output, "--output", [run.path], directory)
    assert files_of(run.path) == before


def test_a_file_output_is_refused_on_any_file_of_a_run(run):
    for output in (
        run.config,
        run.report_json,
        run.checkpoints / "6" / "new",
        run.evaluations / "test.en.step6" / "report.json",
        run.metrics,  # not written yet, but a run writes it
    ):
        with pytest.raises(ValueError, match="is a file of --workdir"):
            check_output_path(output, "--output", [run.path], directory=False)
    check_output_path(run.path / "notes.de", "--output", [run.path], directory=False)


def test_a_directory_output_may_not_go_inside_what_training_reads_back(run):
    with pytest.raises(ValueError, match="is inside --workdir=.*'s own files; give another"):
        check_output_path(run.checkpoints / "report", "--output", [run.path], directory=True)
    # Beside the run's own (its evaluations, say) a report may go.
    check_output_path(run.evaluations / "mine", "--output", [run.path], directory=True)


def test_a_directory_output_may_not_be_another_training_run_but_may_be_an_export(tmp_path, run):
    with pytest.raises(ValueError, match="is a training workdir"):
        check_output_path(run.path, "--output", [], directory=True)
    export = tmp_path / "export"
    export.mkdir()
    (export / EXPORT_MARKER).write_text("{}")
    (export / "config.json").write_text("{}")
    check_output_path(export, "--output", [run.path], directory=True)


def test_a_directory_output_under_a_file_names_the_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=r"--report=.*: .*afile is a file"):
        check_output_path(tmp_path / "afile" / "out", "--report", [], directory=True)


def test_the_message_says_what_to_do_instead(run):
    with pytest.raises(ValueError, match="leave it out$"):
        check_output_path(run.path, "--output", [run.path], True, instead="leave it out")
