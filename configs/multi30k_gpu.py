"""A regularised small Transformer on Multi30k English->German, sized for one GPU.

    python -m translate.train --config=configs/multi30k_gpu.py --workdir=/tmp/multi30k_gpu \
        --config.data.dir=../shared/data/multi30k

or, on a GPU machine that has only the checkout, `python -m scripts.gpu_check --phase=multi30k
--out=DIR` (data copied into gpu_data/multi30k). Trains on train.{en,de}, evaluates on val
during training and on test2016 at the end.

Multi30k's 29,000 caption pairs are few, so the recipe follows the small, heavily regularised
Multi30k setting of Wu et al. 2021 (dropout 0.3, warm-up 2,000 steps, 4,096-token batches,
8,000 updates) rather than the paper's base model; the model is a little larger (4 + 4
layers, d_model 256, d_ff 1,024), since one GPU affords it. Checkpoint averaging is left for
later. The peak learning rate is the paper's schedule at d_model 256 and warm-up 2,000:
256^-0.5 * 2000^-0.5 = 1.4e-3.

Not measured yet: no GPU has run it, so it has no time or BLEU to expect. What is known: a
batch holds a median 3,768 target tokens in its 4,096 slots and costs 212 GFLOP of model FLOPs
(translate/flops.py on its first 50 batches); an epoch is 122 batches, so 8,000 updates are
about 66 epochs. At that size one H100 should take minutes, and the whole command is meant to
finish well under 9.
"""

import pathlib

from translate.config import Config, load_config


def get_config() -> Config:
    # Multi30k's files, splits and 8,000-piece vocabulary from the CPU recipe; the model, row
    # length, schedule and decoding are set here, whatever the CPU recipe chooses.
    config = load_config(pathlib.Path(__file__).with_name("multi30k.py"))
    config.model.norm_position = "post"
    config.data.max_len = 64
    config.data.row_len = 64
    config.model.num_layers = 4
    config.model.d_model = 256
    config.model.num_heads = 4
    config.model.d_ff = 1024
    config.model.dropout_rate = 0.3
    config.data.tokens_per_batch = 4096
    config.train.num_train_steps = 8000
    config.train.warmup_steps = 2000
    config.train.learning_rate_scale = 1.0  # the paper's schedule: peak 1.4e-3, above
    config.train.lr_decay = "rsqrt"
    config.train.log_every_steps = 200
    config.train.checkpoint_every_steps = 1000
    config.train.eval_every_steps = 2000
    config.train.keep_checkpoints = 5
    config.decode.average_last = 1  # averaging left for later, as said above
    config.decode.length_penalty = 0.6
    return config
