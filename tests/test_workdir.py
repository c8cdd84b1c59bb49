"""A run directory, and the one check of where a command may write (translate/workdir.py)."""

import json

import pytest

from translate.workdir import EXPORT_MARKER, Workdir, check_output_path


@pytest.fixture
def run(tmp_path):
    """A workdir as training leaves it, in outline: its lock, config, vocabulary, a checkpoint
    (its params/ and meta/ items), a report, and an evaluation."""
    workdir = Workdir(tmp_path / "run")
    for item in ("params", "meta"):
        (workdir.checkpoints / "6" / item).mkdir(parents=True)
    workdir.lock.write_text("")
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
    with pytest.raises(
        ValueError, match=r"is inside --workdir=.*'s own files \(checkpoints/\); give another"
    ):
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


def best_of(run):
    """`run`'s best/, as training writes it: a parameters-only workdir of its own."""
    best = Workdir(run.best)
    for item in ("params", "meta"):
        (best.checkpoints / "9" / item).mkdir(parents=True)
    best.config.write_text("{}\n")
    best.vocab.write_bytes(b"vocab")
    return best


@pytest.mark.parametrize("directory", [False, True])
def test_every_output_inside_a_runs_best_or_previous_run_is_refused(run, directory):
    best = best_of(run)
    (run.previous_run / "checkpoints").mkdir(parents=True)
    before = files_of(run.path)
    outputs = [
        best.path / "mine.txt",
        best.evaluations / "test.en.step9",
        best.path / "exp",
        run.previous_run / "mine.txt",
        run.previous_run / "checkpoints" / "x",
    ]
    for output in outputs:
        # Given the run, its best/ (as translate-evaluate --workdir=RUN/best is), or neither.
        for workdirs in ([run.path], [best.path], []):
            with pytest.raises(ValueError, match=r"(best|previous_run)/\)") as error:
                check_output_path(output, "--output", workdirs, directory)
            assert str(error.value).startswith(f"--output={output} is ")
            assert "\n" not in str(error.value)
    assert files_of(run.path) == before


def test_a_users_file_beside_a_run_may_be_written_again(run):
    mine = run.path / "translations.txt"
    for workdirs in ([run.path], []):
        check_output_path(mine, "--output", workdirs, directory=False)
        mine.write_text("written once\n")  # as the command writes it
        check_output_path(mine, "--output", workdirs, directory=False)
    # The run's own names stay refused, written yet or not.
    for own in (run.config, run.path / "metrics_loss.png", run.path / ".config.json.0a1b2c3d.tmp"):
        with pytest.raises(ValueError, match="is a file of the training run"):
            check_output_path(own, "--output", [], directory=False)


def test_a_folder_of_another_program_with_config_json_beside_checkpoints_is_no_run(tmp_path):
    other = tmp_path / "project"
    (other / "checkpoints").mkdir(parents=True)
    (other / "checkpoints" / "model.pt").write_bytes(b"weights")
    (other / "config.json").write_text("{}")
    (other / "results.txt").write_text("earlier\n")
    assert not Workdir(other).is_run()
    for output in (other / "results.txt", other / "new.txt", other / "config.json"):
        check_output_path(output, "--output", [], directory=False)
    check_output_path(other / "report", "--output", [], directory=True)
    check_output_path(other, "--output", [], directory=True)


def test_a_run_is_found_by_what_only_a_run_writes(run, tmp_path):
    assert Workdir(run.path).is_run()
    run.lock.unlink()
    assert Workdir(run.path).is_run(), "its checkpoints, as translate/checkpoint.py saves them"
    assert best_of(run).is_run()
    locked = Workdir(tmp_path / "started")
    locked.path.mkdir()
    locked.lock.write_text("")
    assert locked.is_run(), "a run that has not saved a checkpoint yet holds its lock"
