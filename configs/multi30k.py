"""A small Transformer on Multi30k English->German (Elliott et al. 2016), sized for a 2-core CPU.

    python -m translate.train --config=configs/multi30k.py --workdir=/tmp/multi30k \
        --config.data.dir=../shared/data/multi30k

Trains on train.{en,de}, evaluates on val during training and on test2016 at the end.
4 + 4 pre-LayerNorm layers of d_model 128 (Wu et al. 2021's shape, 2.35M parameters), dropout
0.2, see about 15 epochs in 4,000 steps of 2,048 token slots (rows of 48); the learning rate
warms up to 2e-3 over 800 steps and falls linearly to 0. The README's results table has what
the whole command measured on 2 cores.

Chosen on the validation set only (BENCHMARKS.md, "Multi30k recipe search"); val BLEU on all
1,014 sentences, beam 4, alpha 1.2 unless shown:
| recipe | val BLEU |
|---|---|
| before: post-LN, 4,096 slots (rows of 64), dropout 0.1, 1,900 steps | 35.27 |
| the same with pre-LN | 35.70 |
| pre-LN, 2,048 slots (rows of 48), 4,000 steps, warm-up 800, dropout 0.1 | 37.70 |
| the same with a 4,000-piece vocabulary, at step 2,000 of 4,000 | 31.93 (34.38 at 8,000) |
| the same with dropout 0.2 (this recipe) | **37.90** |
| this recipe decoded with alpha 1.0 / 1.5 | 37.88 / 37.76 |
| 1,536 slots, 5,300 steps, warm-up 1,060 (26 min 24 s on 2 cores, against 24 min 13 s) | 38.16 |
Halving the batch doubled the updates at the same tokens and the same wall time, which was
worth 2 BLEU. Averaging the last 3 or 5 checkpoints (200 steps apart) of the dropout-0.1 run
gave 37.65 and 37.69 against its last checkpoint's 37.70, hence average_last 1. The smaller
batch was better on val by 0.26 but left 3.6 of the 30 minutes spare, too few for a machine
that is slower on some days; this recipe leaves 5.8.
"""

from translate.config import Config


def get_config() -> Config:
    config = Config()
    config.model.num_layers = 4
    config.model.d_model = 128
    config.model.num_heads = 4
    config.model.d_ff = 256
    config.model.dropout_rate = 0.2
    config.model.norm_position = "pre"  # Xiong et al. 2020; the paper's is "post"
    config.data.dir = "../shared/data/multi30k"
    config.data.dev_prefix = "val"
    config.data.test_prefix = "test2016"
    config.data.vocab_size = 8000
    # Rows of 48 slots: 6 of the 29,000 training pairs are longer and are dropped (logged).
    config.data.max_len = 48
    config.data.row_len = 48
    config.data.tokens_per_batch = 2048
    config.train.num_train_steps = 4000
    config.train.warmup_steps = 800
    # Peak learning rate 2e-3 (d_model^-0.5 * warmup^-0.5 * 0.64), then linearly to 0.
    config.train.learning_rate_scale = 0.64
    config.train.lr_decay = "linear"
    config.train.log_every_steps = 200
    config.train.checkpoint_every_steps = 200
    config.train.keep_checkpoints = 10
    config.train.eval_every_steps = 2000
    config.decode.average_last = 1
    config.decode.length_penalty = 1.2  # chosen on val, above
    return config
