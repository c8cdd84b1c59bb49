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

Measured on one H100 (BENCHMARKS.md, "Multi30k on one GPU"): the whole command took 327 s
and scored sacreBLEU 37.53 on test2016 (val's first 200 sentences: 43.45 at step 8,000). The
issue's target is 40 within 10 minutes, so this recipe is not yet the answer: training ran at
31-52 steps/s, which for a model this small points at the host, not the GPU. Superseded as
the GPU recipe by `bash scripts/multi30k_gpu_ensemble.sh WORKDIR` (two seeds of
configs/multi30k.py side by side, ensembled): 41.66 on test2016 in 268 s on one H200
(2026-11-28). This config stays for the step benchmarks (scripts/gpu_step_knobs.sh).
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
    config.model.dropout_bits = "threefry"  # measured with it; hash bits on a GPU are untried
    config.train.optimizer = "adam"  # measured with Adam(W); Muon on a GPU is untried
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
