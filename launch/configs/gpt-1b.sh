# GPT ~1.3B on one GPU (80 GB): BF16, Transformer Engine, full recompute off.
CONFIG_ARGS=(
  --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048
  --max-position-embeddings 2048 --position-embedding-type rope --normalization RMSNorm
  --swiglu --ffn-hidden-size 5632 --disable-bias-linear --untie-embeddings-and-output-weights
  --micro-batch-size 4 --global-batch-size 256 --train-iters 100000
  --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2000 --clip-grad 1.0
  --weight-decay 0.1 --adam-beta2 0.95 --bf16 --vocab-size 32000
  --eval-interval 1000 --eval-iters 10 --log-interval 10 --save-interval 1000
)
