"""A small Transformer on Multi30k English->German (Elliott et al. 2016), sized for a 2-core CPU.

    python -m translate.train --config=configs/multi30k.py --workdir=/tmp/multi30k \
        --config.data.dir=../shared/data/multi30k

Trains on train.{en,de}, evaluates on val during training and on test2016 at the end.
4 + 4 layers of d_model 128 (Wu et al. 2021's shape, 2.35M parameters) see about 18 epochs in
1,900 steps of 4,096 token slots; the learning rate warms up to 2e-3 and falls linearly to 0.
At 0.79 s a step on 2 idle cores (scripts/benchmark.py) the training takes about 25 minutes;
the README's results table has what the whole command measured.

Chosen on the validation set only (BENCHMARKS.md, "Multi30k recipe search"):
| recipe | val BLEU (all 1,014) | val BLEU (first 200) |
|---|---|---|
| before: 3 + 3 layers, d_model 256, 2,048 tokens, rsqrt, peak 1e-3 | | 34.89 |
| this shape with rsqrt, peak 2e-3, 1,500 steps | | 34.77 |
| this shape, linear decay, 1,900 steps, alpha 0.6 | 34.39 | 35.84 |
| the same model decoded with alpha 1.0 / 1.2 / 1.5 | 35.21 / **35.27** / 35.05 | |
| the mean of the last 3 / 5 checkpoints, alpha 1.0 | 35.05 / 34.71 | |
Its output was short (brevity penalty 0.95 at alpha 0.6), hence alpha 1.2; averaging
checkpoints 100 steps apart lost BLEU, hence average_last 1.
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
    config.decode.length_penalty = 1.2  # chosen on val, above
    return config
