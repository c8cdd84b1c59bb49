"""The paper's big Transformer on WMT14 English->German from TFDS (Table 2, "big").

    python -m translate.train --config=configs/wmt14_big.py --workdir=runs/wmt14_big \
        [--config.data.tfds_data_dir=DIR] [--config.train.grad_accum_steps=8 on one GPU]

The data, vocabulary and batch are those of configs/wmt14_base.py; the model has d_model 1024,
d_ff 4096, 16 heads and dropout 0.3, and trains for 300,000 steps. The paper trained it for
3.5 days on 8 P100 GPUs and reported 28.4 tokenized BLEU on newstest2014 (averaging the last
20 checkpoints, beam 4, alpha 0.6).
"""

import pathlib

from translate.config import Config, load_config


def get_config() -> Config:
    config = load_config(pathlib.Path(__file__).with_name("wmt14_base.py"))
    config.model.d_model = 1024
    config.model.d_ff = 4096
    config.model.num_heads = 16
    config.model.dropout_rate = 0.3
    config.train.num_train_steps = 300_000
    # Sec. 6.1: the mean of the last 20 checkpoints, written at 10-minute intervals: about 600
    # of the paper's 1.0 s big-model steps (300,000 in 3.5 days).
    config.decode.average_last = 20
    config.train.keep_checkpoints = 20
    config.train.checkpoint_every_steps = 600
    return config
