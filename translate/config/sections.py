"""The config's sections: every field with its type, its default (the paper's base model) and,
in the comment above it, its description, which `--help` prints (loading.py's
`field_descriptions` reads it from this file).
"""

from __future__ import annotations

import dataclasses

from translate.config.choices import (
    Architecture,
    AttentionKernel,
    BeamStop,
    ComputeDtype,
    DataSource,
    DropoutBits,
    FeedForwardKind,
    KeepBestBy,
    LossKeep,
    LrDecay,
    MatmulDtype,
    Normalization,
    NormPosition,
    OnNonfinite,
    Optimizer,
    PositionScheme,
    PrefixAttention,
)


@dataclasses.dataclass
class ModelConfig:
    # Encoder and decoder layers each (Sec. 3.1: N = 6).
    num_layers: int = 6
    # Width of every sub-layer output and embedding (Sec. 3.1).
    d_model: int = 512
    # Attention heads; d_model must divide evenly (Sec. 3.2.2: h = 8).
    num_heads: int = 8
    # Inner width of the position-wise feed-forward network (Sec. 3.3).
    d_ff: int = 2048
    # Dropout on sub-layer outputs and on embedding + position sums (Sec. 5.4: P_drop = 0.1).
    dropout_rate: float = 0.1
    # Dropout on the attention weights after the softmax, in training (not in the paper;
    # tensor2tensor's attention_dropout, fairseq's --attention-dropout). Above 0 the training
    # step forms the weights itself instead of calling the fused cuDNN kernel; decoding is
    # unchanged.
    attention_dropout_rate: float = 0.0
    # Dropout on the feed-forward network's inner ReLU activations, in training (not in the
    # paper; tensor2tensor's relu_dropout, fairseq's --activation-dropout).
    activation_dropout_rate: float = 0.0
    # Where dropout's random bits come from: "threefry" (JAX's generator) or "hash" (a counter
    # hash with a third of the integer operations, models/dropout.py's hashed_words: other masks,
    # so other numbers; the Multi30k recipe's whole step x0.955, scripts/benchmark.py --variant).
    dropout_bits: DropoutBits = "threefry"
    # "auto": bfloat16 on GPU/TPU, float32 on CPU. Parameters are always float32.
    compute_dtype: ComputeDtype = "auto"
    # The operands of the linear layers' and the output projection's matrix products: "compute"
    # (the compute dtype) or "bfloat16" (rounded to bfloat16 in both passes, accumulated and
    # returned in float32, the rest of the model in the compute dtype: mixed precision as TPUs
    # run float32 products by default). On this project's CPU (AMD EPYC, AVX512-BF16) such
    # products ran about 1.8x as fast, the Multi30k recipe's step 1.4x (docs/speed.md).
    matmul_dtype: MatmulDtype = "compute"
    # Attention kernel of jax.nn.dot_product_attention: "xla", "cudnn" (fused, GPU only, bf16 or
    # fp16) or "auto": cuDNN on GPU when the compute dtype and head size allow, else XLA.
    attention: AttentionKernel = "auto"
    # Where each sub-layer's LayerNorm sits: "post" is the paper's LayerNorm(x + Sublayer(x))
    # (Sec. 3.1); "pre" is x + Sublayer(LayerNorm(x)) with a final LayerNorm on each stack
    # (Xiong et al. 2020), which trains stably at higher learning rates and depths.
    norm_position: NormPosition = "post"
    # "encoder_decoder" (the paper) or "decoder_only": one stack of num_layers self-attention
    # + feed-forward layers over `source <sep> target`, scored on the target
    # (models/decoder_only.py).
    architecture: Architecture = "encoder_decoder"
    # Decoder-only: "causal" (each token sees those before it) or "bidirectional" (source
    # tokens also see the source tokens after them: a prefix LM).
    prefix_attention: PrefixAttention = "causal"
    # How tokens know their place: "sinusoidal" (Sec. 3.5, added to the embeddings), "rotary"
    # (Su et al. 2021: each self-attention's queries and keys rotated by their position) or
    # "relative" (T5's learned bias on each self-attention's scores by bucketed distance,
    # Raffel et al. 2020). Cross-attention takes no positions in either (models/positions.py).
    positions: PositionScheme = "sinusoidal"
    # "layernorm" (Ba et al. 2016, the paper's) or "rmsnorm" (Zhang & Sennrich 2019: no mean,
    # no bias), for every normalisation of the model.
    normalization: Normalization = "layernorm"
    # The position-wise feed-forward network: "relu" (Sec. 3.3), "gelu" (tanh form), "silu"
    # (Swish with beta 1, OPUS-MT's Marian models), or the gated "swiglu" and "geglu" (Shazeer
    # 2020: act(x W) * (x V), then W2). A gated network has three matrices of d_model x d_ff
    # against two: d_ff = 2/3 of the ungated width keeps the parameter count.
    feed_forward: FeedForwardKind = "relu"
    # Key and value heads (grouped-query attention, Ainslie et al. 2023; 1 = multi-query,
    # Shazeer 2019): each serves num_heads / num_kv_heads query heads, in self- and
    # cross-attention. 0 = num_heads, the paper's.
    num_kv_heads: int = 0
    # Biases in the linear layers (the paper's; the key projection never has one). False drops
    # them from every attention projection and the feed-forward network, as T5 and Llama do.
    use_bias: bool = True
    # Sec. 3.4: the embeddings are multiplied by sqrt(d_model). False leaves them as they are,
    # as Marian models with `scale_embedding: false` do.
    scale_embeddings: bool = True
    # A learned bias on the pre-softmax projection, from zero (Marian's final_logits_bias);
    # the paper's projection is the embedding alone (Sec. 3.4).
    logits_bias: bool = False
    # Sec. 3.4 shares one embedding matrix between the encoder, the decoder and the projection.
    # False gives the encoder a matrix of its own, the decoder's staying tied to the projection
    # (Marian's share_encoder_decoder_embeddings=false, OPUS-MT's tc-big models).
    share_encoder_decoder_embeddings: bool = True


@dataclasses.dataclass(frozen=True)
class TrainCorpus:
    # File stem of the corpus's parallel files in data.dir ({prefix}.{src_lang} and
    # {prefix}.{tgt_lang}); give this or tfds_split.
    prefix: str = ""
    # A split of the TFDS dataset data.tfds_name ("train", "train[:10%]"); give this or prefix.
    tfds_split: str = ""
    # An upsampling factor: each epoch draws round(weight x its pairs) of the corpus's pairs,
    # every pair floor(weight) times and a random share of them once more (at least one pair).
    weight: float = 1.0
    # A piece prepended to each of the corpus's sources, reserved in the shared vocabulary when
    # it is trained (tagged back-translation, Caswell et al. 2019: "<BT>"); "" = none.
    tag: str = ""


@dataclasses.dataclass
class DataConfig:
    # "files" (parallel text in `dir`), "synthetic" (generated by translate.data.synthetic),
    # "tfds" (a TFDS translation dataset, prepared and read without TensorFlow by
    # translate.data.wmt) or
    # "monolingual" (one language's text, {train,dev}_prefix.tgt_lang in `dir`, for a language
    # model: the decoder-only architecture scored on every token).
    source: DataSource = "files"
    # Directory holding {train,dev,test}_prefix.{src_lang,tgt_lang} for source "files".
    dir: str = ""
    # File stem of the training, development and test sets inside `dir` ("" for no dev or test
    # set; a named set whose files are missing is an error).
    train_prefix: str = "train"
    dev_prefix: str = "val"
    test_prefix: str = "test"
    # Several training corpora drawn together, in place of train_prefix and tfds_train_split:
    # each a TrainCorpus of a prefix (files in `dir`) or a tfds_split (of tfds_name), a weight
    # (an upsampling factor: an epoch draws round(weight x its pairs) of them) and a tag (a piece
    # reserved in the vocabulary and put before each of its sources: tagged back-translation).
    # On the command line a JSON list: '[{"prefix": "train", "weight": 2}, {"prefix": "bt",
    # "tag": "<BT>"}]'. Each is tokenized once, into a cache of its own; () = the one corpus of
    # train_prefix (tfds_train_split).
    train_corpora: tuple[TrainCorpus, ...] = ()
    # TFDS dataset "name/config" for source "tfds"; both languages must be in its pair.
    tfds_name: str = "wmt14_translate/de-en"
    # Root of prepared TFDS datasets; "" means $TFDS_DATA_DIR, else TFDS's default
    # (~/tensorflow_datasets). Archives fetched by hand go in <root>/downloads/manual.
    tfds_data_dir: str = ""
    # TFDS splits for training, development and test; slices such as "train[:1%]" work.
    tfds_train_split: str = "train"
    tfds_dev_split: str = "validation"
    tfds_test_split: str = "test"
    # Language suffixes (language codes for TFDS); the source is translated into the target.
    src_lang: str = "en"
    tgt_lang: str = "de"
    # Pieces in the shared SentencePiece BPE vocabulary (Sec. 5.1: about 37,000).
    vocab_size: int = 37000
    # Sentences (both languages together) drawn at random, seeded by train.seed, to train the
    # vocabulary.
    vocab_sample_size: int = 1_000_000
    # Pairs with more tokens than this on either side (EOS included) are dropped and counted.
    max_len: int = 256
    # Length of a packed row of tokens; a batch is `tokens_per_batch // row_len` rows.
    row_len: int = 256
    # Token slots per side per optimizer step over all devices (Sec. 5.1: ~25,000).
    tokens_per_batch: int = 25_000
    # Number of pairs generated per split when source == "synthetic".
    synthetic_num_train: int = 20_000
    synthetic_num_dev: int = 500
    synthetic_num_test: int = 1_000
    # Subword regularisation (BPE-dropout; Kudo 2018, Provilkov et al. 2020): each epoch the
    # training sources (src_) and targets (tgt_) are segmented anew, every merge dropped with
    # this probability, seeded by train.seed and the epoch; 0 = off (the pieces tokenized once).
    # Dev and test keep the deterministic segmentation. A resumed run sees the pieces an
    # uninterrupted one sees (our own sampler, translate/data/bpe_dropout.py).
    src_subword_alpha: float = 0.0
    tgt_subword_alpha: float = 0.0


@dataclasses.dataclass
class TrainConfig:
    # Optimizer steps (Sec. 5.2: 100,000 for the base model).
    num_train_steps: int = 100_000
    # Linear warm-up steps of the learning-rate schedule (Sec. 5.3).
    warmup_steps: int = 4000
    # Multiplies the paper's schedule d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
    learning_rate_scale: float = 1.0
    # After warm-up: "rsqrt" (the paper's step^-0.5), or "linear" or "cosine" from the same peak
    # towards 0 at num_train_steps, which helps runs too short for rsqrt to have fallen far.
    lr_decay: LrDecay = "rsqrt"
    # "adam": the paper's Adam (AdamW with train.weight_decay) for every parameter. "muon": Muon
    # (Jordan et al. 2024: momentum orthogonalised by Newton-Schulz iterations) for every linear
    # layer's kernel, its update scaled to AdamW's RMS (Liu et al. 2025) so that the same
    # learning rate and weight decay apply, and that Adam for the embedding, biases and
    # LayerNorms (training/optim.py). A run cannot switch it when it resumes.
    optimizer: Optimizer = "adam"
    # Adam hyper-parameters (Sec. 5.3).
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    # Decoupled weight decay (Loshchilov & Hutter 2019; PyTorch's AdamW, fairseq's
    # --weight-decay): after Adam's update, every matrix and embedding (not the biases and
    # LayerNorm gains) also moves by -learning_rate * weight_decay * itself. 0 = off, the paper's
    # Adam; a run cannot switch it between 0 and non-zero when it resumes (another optimizer
    # state).
    weight_decay: float = 0.0
    # Label smoothing epsilon (Sec. 5.4).
    label_smoothing: float = 0.1
    # What the loss keeps from its forward pass for the backward pass (training/losses.py,
    # projected_cross_entropy): "exp" (fastest on CPUs), "logits" (fewer passes over the
    # [tokens x vocabulary] float32 logits, for GPUs), "logits_bf16" (the logits rounded to
    # bfloat16, half the bytes again), or "auto": "exp" on CPUs, else "logits".
    loss_keep: LossKeep = "auto"
    # An exponential moving average of the parameters, kept beside them and saved in the
    # checkpoints: ema = d * ema + (1 - d) * params after every applied step, with
    # d = min(ema_decay, (1 + step) / (10 + step)); the dev and final evaluations and the
    # decoding commands use it (their --params=raw the parameters themselves). 0 = off.
    ema_decay: float = 0.0
    # Micro-batches accumulated per optimizer step; the batch is split evenly among them.
    grad_accum_steps: int = 1
    # Optimizer steps run in one call of the jitted program (a lax.scan over this many batches):
    # one host dispatch for several steps, for a small model whose step the host bounds (on a
    # GPU: docs/speed.md). The steps agree with single steps to float32 rounding only, not bit
    # for bit. The log, checkpoint, dev-evaluation and multi-host stop intervals must be
    # multiples of it; steps left over at the end run one a call.
    steps_per_call: int = 1
    # Seed for parameters, data order and dropout.
    seed: int = 0
    # Steps between lines of the training log (loss, speed) in metrics.jsonl and TensorBoard.
    log_every_steps: int = 100
    # Steps between checkpoints; a run resumes from the newest.
    checkpoint_every_steps: int = 1000
    # Checkpoints kept on disk; at least decode.average_last, which the final evaluation averages.
    keep_checkpoints: int = 5
    # A step whose loss or gradient is not finite is never applied; "stop" ends the run there
    # (naming the step), "skip" carries on and counts such steps in the log.
    on_nonfinite: OnNonfinite = "stop"
    # With on_nonfinite "skip": this many skipped steps in a row stop the run (it has stopped
    # learning).
    max_consecutive_skips: int = 100
    # On several hosts: every this many steps they agree whether any received SIGTERM or SIGINT,
    # and all stop at the same step (a small all-gather; one process checks every step).
    stop_check_every_steps: int = 10
    # Dev loss and dev BLEU on `eval_num_sentences` dev sentences every this many steps.
    eval_every_steps: int = 1000
    # Start from another run's parameters: "WORKDIR" (its newest checkpoint) or "WORKDIR@STEP";
    # "" = off. The optimizer and the step start afresh (fine-tuning, a new domain); the
    # vocabulary is that run's. A resumed run continues from its own checkpoints instead.
    init_from: str = ""
    # "dev_bleu": also keep the checkpoint with the best dev BLEU so far, in the workdir's
    # best/ (a workdir of its own for evaluate, translate and init_from); "" = off.
    keep_best_by: KeepBestBy = ""
    # Stop after this many dev evaluations in a row without a better dev BLEU, then save and
    # test as at the last step; 0 = off (the paper trains a fixed number of steps).
    early_stopping_patience: int = 0
    # "A:B": a jax.profiler trace of steps A to B (as the log counts them) into the workdir's
    # profile/; "" = off.
    profile_steps: str = ""


@dataclasses.dataclass
class DecodeConfig:
    # Beam width (Sec. 6.1: 4); 1 is greedy decoding.
    beam_size: int = 4
    # alpha in the GNMT length penalty ((5 + len) / 6) ** alpha (Sec. 6.1: 0.6).
    length_penalty: float = 0.6
    # Output may be at most source length + this many tokens (Sec. 6.1: 50).
    max_extra_len: int = 50
    # When beam search stops a sentence: "exact", once no live hypothesis can beat its
    # beam_size finished ones (exact, but loose: it assumes the longest allowed output's length
    # penalty); "finished", once beam_size hypotheses have ended, EOS counting only among the
    # beam_size best candidates of a step (fairseq, CTranslate2, transformers' early_stopping).
    beam_stop: BeamStop = "exact"
    # Whether greedy and beam search never choose BOS, the decoder's start piece, as sampling
    # never draws it. Off for our models, which never learn to write it (nor do the engines we
    # export to ban it); translate-import turns it on for a model with OPUS-MT's tokenizer,
    # whose start is its pad, a piece its softmax scores and its configs ban from outputs.
    ban_start: bool = False
    # Sentences decoded together. Chosen with `parallel_batches` on 2 CPU cores (BENCHMARKS.md):
    # 32 with 3 in flight decoded Multi30k's test2016 faster than 64 with 2 (beam 4
    # by 1.07-1.10x, greedy by 1.15-1.3x), with the same output tokens.
    batch_size: int = 32
    # Batches searched at once, each in its own thread: a search step is hundreds of small ops,
    # most of them on one core, so other batches in flight keep a 2-core CPU busy (beam 4 ran
    # 1.3-1.4x and greedy 1.1-1.4x as fast with 2 as with 1). The outputs do not change.
    parallel_batches: int = 3
    # Dev sentences decoded for BLEU during training (0 = whole dev set).
    eval_num_sentences: int = 200
    # The test report and the last dev BLEU of a training run decode the mean parameters of
    # the newest this many checkpoints (Sec. 6.1: 5 for base, 20 for big; 1 = the last step's).
    average_last: int = 5
    # The decoder layer (from 0) whose cross-attention, heads averaged, gives word alignments
    # (translate-text and translate-score --alignment); -1: the second-to-last, Garg et al.
    # 2019's choice for the paper's 6 layers. Recipes choose theirs on val against eflomal
    # (scripts/compare/alignment_agreement.py).
    alignment_layer: int = -1
