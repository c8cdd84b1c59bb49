"""The Multi30k student: the recipe's model and budget, trained on the training pairs and on the
teachers' ensemble's translations of the same sources (sequence-level distillation).

    translate-data multi30k --dir=data/multi30k      # once
    translate-distill --dir=/tmp/m30k_distill --teacher_config=multi30k --num_teachers=2 \
        --student_config=multi30k_student

For `translate-distill` only: `original` and `distilled` are the corpora the pipeline writes in
its corpus/ directory, and it sets data.dir there. Everything else (model, optimizer, 5,000
steps, decoding) is configs/multi30k.py's, so the student costs what one teacher costs.

Expect, on 2 AMD EPYC vCPUs (2026-12-05, commit 4858bcb), from the ensemble of the recipe's
seed 0 and its multi-query run: about 20 minutes a student, test2016 sacreBLEU 41.51, the mean of
seeds 0-2 (41.47-41.60); lowercased tokenized BLEU 41.97; val mean 42.06, below the teachers'
ensemble's 43.01 (docs/distillation.md has that command and every stage's time).
"""

import pathlib

from translate.config import Config, TrainCorpus, load_config


def get_config() -> Config:
    config = load_config(pathlib.Path(__file__).with_name("multi30k.py"))
    config.data.train_corpora = (TrainCorpus("original"), TrainCorpus("distilled"))
    return config
