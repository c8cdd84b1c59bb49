"""Ensemble distillation and back-translation, stage by stage.

`translate-distill` (translate/distill.py) makes a plan (pipeline/plan.py: every input checked
before anything is written) and runs it (pipeline/stages.py, `run_pipeline(plan, directory)`).
Its state is one directory (pipeline/directory.py); the stages, listed once (`plan_stages`) for
the run and the report, run in order, each resumes where a kill stopped it and none is redone
once done:

    corpus           the teachers' training, dev and test text, written once as files:
                     corpus/original.{src,tgt}, corpus/dev.*, corpus/test.*
    teacher-N        teachers trained from a config, seed after seed, on those files (or
                     given as trained workdirs); teachers after the first get its vocabulary,
                     so that they decode as one ensemble
    reverse          optional: a model of the other direction, trained on the same files
    distilled        the teachers' ensemble decodes every training source (beam search, its
                     n-best, or samples, as the decode settings say): corpus/distilled.*
                     (Kim & Rush 2016's sequence-level distillation; Freitag et al. 2017)
    back_translated  the reverse model decodes every training target into a new source:
                     corpus/back_translated.* (Sennrich et al. 2016; tagged: Caswell et al. 2019)
    student-N        the student trained on the corpora its config's data.train_corpora names
    evaluations      the teachers' ensemble and each student on the full dev and test sets
    report           report.json and report.txt: every input, every stage's time, the scores

Decoding writes parts of `LINES_PER_PART` lines, each whole or not at all, and a rerun decodes
only the parts missing: a part is decoded from the same lines, with the same models, whether or
not the run was stopped, so the corpus and the student are the same bit for bit. A finished
stage leaves stages/NAME.json (its outputs' sha256 and its time); the training stages resume
from their own checkpoints.
"""
