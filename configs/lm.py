"""A language model on real text: the paper's Transformer, bytes in, bytes out.

  python launch/train.py --config=configs/lm.py:heads=4 --workdir=runs/lm_4
  python launch/train.py --config=configs/lm.py:heads=8,seed=1,size=gpu --workdir=runs/lm_8 \
      --config.data.path=corpus.txt --config.optim.steps=50000

Arguments: `heads` (1, 2, 4, 8 or 16), `seed`, `size`. Every size is parameter-matched
across head counts: d_model is fixed and the head dimension is d_model / heads, so it
shrinks as heads grow and every head count has exactly the same parameters.
`config.data` is the corpus (`config.data.path`; empty: the default corpus),
`config.optim.steps` the number of updates. AdamW, linear warmup then cosine decay to a
tenth, gradients clipped to global norm 1; bfloat16 compute on accelerators, float32 on
CPU; `config.optim.microbatches` slices of each device's batch accumulate one gradient.

Named sizes, with the hardware each is meant for and its expected throughput. On
accelerators the estimate is FLOPs, not a measurement: 40% of the chips' dense bfloat16
peak over the training FLOPs per token (6 N + 12 L d T, `text_config.flops_per_token`):

  cpu   the paper's d 64 and 4 layers (240,640 parameters), T 128, batch 32, 300 steps:
        2 CPU cores; 2.81 bits/byte on the default corpus's held-out split (measured:
        see docs/study.md for the time).
  gpu   d 768, 12 layers, T 1024, batch 64 in 2 microbatches (GPT-2 small's shape,
        86.2 M parameters): one H100 (989 TFLOP/s): about 6.3e5 tokens/s.
  gpu8  the gpu model, batch 512 (64 per GPU, 2 microbatches): eight H100s: about 5.1e6
        tokens/s.
  tpu   the gpu model, batch 256 (16 per chip, 4 microbatches): a TPU v5e-16 pod slice
        (16 chips of 197 TFLOP/s, 16 GB each): about 2.0e6 tokens/s.
"""

from beyondpar.study import config_lib

GPT2_SMALL = dict(embed_dim=768, num_layers=12, mlp_dim=3072, max_len=1024)
SIZES = {
    "cpu": dict(
        hardware="2 CPU cores",
        devices=1,
        memory_gb=None,
        model=dict(embed_dim=64, num_layers=4, mlp_dim=256, max_len=128),
        seq_len=128,
        optim=dict(batch_size=32, microbatches=1, learning_rate=1e-2, warmup_steps=30, steps=300),
        every=dict(log=20, eval=100, checkpoint=100),
    ),
    "gpu": dict(
        hardware="one H100",
        devices=1,
        memory_gb=80,
        model=GPT2_SMALL,
        seq_len=1024,
        optim=dict(
            batch_size=64, microbatches=2, learning_rate=6e-4, warmup_steps=1000, steps=50000
        ),
        every=dict(log=50, eval=1000, checkpoint=1000),
    ),
    "gpu8": dict(
        hardware="eight H100s",
        devices=8,
        memory_gb=80,
        model=GPT2_SMALL,
        seq_len=1024,
        optim=dict(
            batch_size=512, microbatches=2, learning_rate=6e-4, warmup_steps=700, steps=20000
        ),
        every=dict(log=50, eval=1000, checkpoint=1000),
    ),
    "tpu": dict(
        hardware="a TPU v5e-16 pod slice",
        devices=16,
        memory_gb=16,
        model=GPT2_SMALL,
        seq_len=1024,
        optim=dict(
            batch_size=256, microbatches=4, learning_rate=6e-4, warmup_steps=700, steps=30000
        ),
        every=dict(log=50, eval=1000, checkpoint=1000),
    ),
}


def get_config(arg=None):
    args = config_lib.parse_arg(arg, heads=4, seed=0, size="cpu")
    if args.size not in SIZES:
        raise ValueError(f"config argument size must be one of {sorted(SIZES)}, got {args.size!r}")
    size = SIZES[args.size]
    config = config_lib.base_text_config()
    config.size = args.size
    config.seed = args.seed
    config.model.update(size["model"], num_heads=args.heads)
    config.seq_len = size["seq_len"]
    config.optim.update(size["optim"])
    config.log_every_steps = size["every"]["log"]
    config.eval_every_steps = size["every"]["eval"]
    config.checkpoint_every_steps = size["every"]["checkpoint"]
    return config
