"""A small Transformer on Multi30k English->German (Elliott et al. 2016), sized for a 2-core CPU.

    python -m translate.train --config=configs/multi30k.py --workdir=/tmp/multi30k \
        --config.data.dir=../shared/data/multi30k

Trains on train.{en,de}, evaluates on val during training and on test2016 at the end.
Expect about 26 minutes on 2 CPU cores and sacreBLEU about 34 on test2016 (34.16 and chrF
56.94 measured at commit e79e1df in 25 min 37 s, the whole command).
"""

from translate.config import Config


def get_config() -> Config:
    config = Config()
    config.model.num_layers = 4
    config.model.d_model = 128
    config.model.num_heads = 4
    config.model.d_ff = 256
    config.model.dropout_rate = 0.1
    config.data.dir = "../shared/data/multi30k"
    config.data.dev_prefix = "val"
    config.data.test_prefix = "test2016"
    config.data.vocab_size = 8000
    config.data.max_len = 64
    config.data.row_len = 64
    config.data.tokens_per_batch = 4096
    config.train.num_train_steps = 1900
    config.train.warmup_steps = 400
    # Peak learning rate 2e-3 (d_model^-0.5 * warmup^-0.5 * 0.4525), then linearly to 0.
    config.train.learning_rate_scale = 0.4525
    config.train.lr_decay = "linear"
    config.train.log_every_steps = 100
    config.train.checkpoint_every_steps = 100
    config.train.keep_checkpoints = 10
    config.train.eval_every_steps = 950
    config.decode.average_last = 1
    return config
