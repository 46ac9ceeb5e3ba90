# Tiny GPT for a CPU (debugging, CI): the embedded default, spelled out.
# Used as: launch/torchrun.sh tiny-cpu [extra flags]
CONFIG_ARGS=(
  --num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128
  --micro-batch-size 8 --global-batch-size 16 --train-iters 400
  --lr 1.5e-3 --min-lr 1.5e-4 --lr-decay-style cosine --clip-grad 1.0
  --eval-interval 50 --eval-iters 4 --log-interval 10
)
