"""The Multi30k student: the recipe's model and budget, trained on the training pairs and on the
teachers' ensemble's translations of the same sources (sequence-level distillation).

    translate-data multi30k --dir=data/multi30k      # once
    translate-distill --dir=/tmp/m30k_distill --teacher_config=multi30k --num_teachers=2 \
        --student_config=multi30k_student

For `translate-distill` only: `original` and `distilled` are the corpora the pipeline writes in
its corpus/ directory, and it sets data.dir there. Everything else (model, optimizer, 5,000
steps, decoding) is configs/multi30k.py's, so the student costs what one teacher costs. Its
scores on Multi30k have not been measured yet: the corpora and weights are a starting point
(Kim & Rush 2016 train on the distilled pairs; here the real ones are kept beside them), to be
chosen on val.
"""

import pathlib

from translate.config import Config, TrainCorpus, load_config


def get_config() -> Config:
    config = load_config(pathlib.Path(__file__).with_name("multi30k.py"))
    config.data.train_corpora = (TrainCorpus("original"), TrainCorpus("distilled"))
    return config
