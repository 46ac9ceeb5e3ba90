# GPT ~10B on 16 GPUs (2 nodes x 8): TP 4 x PP 2 x DP 2, ZeRO-1, overlapped grad reduction.
CONFIG_ARGS=(
  --num-layers 40 --hidden-size 5120 --num-attention-heads 40 --seq-length 4096
  --max-position-embeddings 4096 --position-embedding-type rope --normalization RMSNorm
  --swiglu --ffn-hidden-size 13824 --disable-bias-linear --untie-embeddings-and-output-weights
  --group-query-attention --num-query-groups 8
  --tensor-model-parallel-size 4 --sequence-parallel --pipeline-model-parallel-size 2
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
  --micro-batch-size 1 --global-batch-size 512 --train-iters 200000
  --lr 1.5e-4 --min-lr 1.5e-5 --lr-decay-style cosine --lr-warmup-iters 2000 --clip-grad 1.0
  --weight-decay 0.1 --adam-beta2 0.95 --bf16 --vocab-size 32000
  --eval-interval 2000 --eval-iters 10 --log-interval 10 --save-interval 1000
  --loss-spike-action skip
)
