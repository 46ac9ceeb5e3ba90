# GPT MoE ~100B total parameters (64 experts of 2560, top-2: 99B, 5.3B active a token) on
# 128 GPUs (16 nodes x 8): TP 2 x PP 8 x EP 8, ZeRO-1.
CONFIG_ARGS=(
  --num-layers 48 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096
  --max-position-embeddings 4096 --position-embedding-type rope --normalization RMSNorm
  --swiglu --ffn-hidden-size 14336 --disable-bias-linear --untie-embeddings-and-output-weights
  --group-query-attention --num-query-groups 8
  --num-experts 64 --moe-ffn-hidden-size 2560 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2
  --moe-token-dispatcher-type alltoall --expert-model-parallel-size 8
  --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 8
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
  --micro-batch-size 1 --global-batch-size 1024 --train-iters 250000
  --lr 1.2e-4 --min-lr 1.2e-5 --lr-decay-style cosine --lr-warmup-iters 2000 --clip-grad 1.0
  --weight-decay 0.1 --adam-beta2 0.95 --bf16 --vocab-size 32000
  --eval-interval 2000 --eval-iters 10 --log-interval 10 --save-interval 500
  --loss-spike-action skip
)
