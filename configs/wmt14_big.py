"""The paper's big Transformer on WMT14 English->German from TFDS (Table 2, "big").

    translate-train --config=wmt14_big --workdir=runs/wmt14_big \
        [--config.data.tfds_data_dir=DIR] [--config.train.grad_accum_steps=8 on one GPU]

The data, vocabulary and batch are those of configs/wmt14_base.py; the model is configs/big.py's
(d_model 1024, d_ff 4096, 16 heads, dropout 0.3, 300,000 steps), decoded with the mean of the
last 20 checkpoints, beam 4, alpha 0.6. Result to expect: not measured yet (the paper: 28.4
tokenized BLEU on newstest2014 after 3.5 days on 8 P100 GPUs).
"""

import pathlib
import runpy

from translate.config import Config, load_config

HERE = pathlib.Path(__file__).parent


def get_config() -> Config:
    make_big = runpy.run_path(str(HERE / "big.py"))["make_big"]
    return make_big(load_config(HERE / "wmt14_base.py"))
