"""A tiny model on a tiny synthetic corpus, for tests and fault injection.

    translate-train --config=tiny --workdir=/tmp/tiny

Generates 400 training pairs, trains 6 steps of a 2 + 2 layer model of d_model 32, and decodes
its 16 test sentences: seconds for the whole command. Its BLEU means nothing; the run exercises
every part of the trainer (data, vocabulary, checkpoints, evaluation, report) quickly.
"""

from translate.config import Config


def get_config() -> Config:
    config = Config()
    config.model.num_layers = 2
    config.model.d_model = 32
    config.model.num_heads = 4
    config.model.d_ff = 64
    config.data.source = "synthetic"
    config.data.vocab_size = 200
    config.data.max_len = 32
    config.data.row_len = 32
    config.data.tokens_per_batch = 32 * 16
    config.data.synthetic_num_train = 400
    config.data.synthetic_num_dev = 16
    config.data.synthetic_num_test = 16
    config.train.num_train_steps = 6
    config.train.warmup_steps = 10
    config.train.log_every_steps = 2
    config.train.checkpoint_every_steps = 3
    config.train.eval_every_steps = 100
    config.decode.batch_size = 8
    config.decode.eval_num_sentences = 8
    config.decode.max_extra_len = 8
    # The last step alone: tests that want averaging ask for it.
    config.decode.average_last = 1
    return config
