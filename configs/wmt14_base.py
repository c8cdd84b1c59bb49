"""The paper's base Transformer on WMT14 English->German from TFDS (Table 2, "base").

    translate-train --config=wmt14_base --workdir=runs/wmt14_base \
        [--config.data.tfds_data_dir=DIR] [--config.train.grad_accum_steps=8 on one GPU]

Data: TFDS `wmt14_translate/de-en` (about 4.5M training pairs from Europarl v7, CommonCrawl and
News Commentary v9), dev newstest2013, test newstest2014 (all 3,003 sentences), prepared once as
array_record without TensorFlow (translate/data/wmt.py). English is the source; for German->English
pass --config.data.src_lang=de --config.data.tgt_lang=en. A shared 37,000-piece BPE vocabulary
is trained on 1M sampled sentences and the training set is tokenized once into the workdir.

Each optimizer step holds about 25,000 source and 25,000 target token slots in total (96 rows
of 256), split over all devices and `train.grad_accum_steps` micro-batches, so one GPU with 8
accumulation steps sees the same batch as 8 GPUs with one. Trains 100,000 steps and decodes
newstest2014 with the mean of the last 5 checkpoints, beam 4, alpha 0.6. Result to expect: not
measured yet (the paper: 27.3 tokenized BLEU after 12 hours on 8 P100 GPUs).
"""

from translate.config import Config


def get_config() -> Config:
    config = Config()
    config.data.source = "tfds"
    config.data.tfds_name = "wmt14_translate/de-en"
    config.data.tfds_train_split = "train"
    # The wmt14 builder's validation split is newstest2013; its test split is newstest2014.
    config.data.tfds_dev_split = "validation"
    config.data.tfds_test_split = "test"
    config.data.src_lang = "en"
    config.data.tgt_lang = "de"
    config.data.vocab_size = 37000
    config.data.vocab_sample_size = 1_000_000
    config.data.max_len = 256
    config.data.row_len = 256
    config.data.tokens_per_batch = 25_000
    config.train.num_train_steps = 100_000
    # Sec. 6.1: the mean of the last 5 checkpoints, 10 minutes (about 1,400 steps) apart.
    config.decode.average_last = 5
    config.train.checkpoint_every_steps = 1000
    return config
