#!/usr/bin/env bash
# Rendered by tuner for node 0 of 6: tp=4,pp=6,cp=1,dp=2,vp=1,sp=0,mbs=1,gbs=96,recompute=none,distopt=0,zero=1
# Every value below went through the shq filter (shlex.quote): nothing in it is run by the shell.
set -euo pipefail
# The nodes' python first, so torchrun and DeepSpeed's op builds (ninja) come from the same venv.
export PATH=/opt/venv/bin:"$PATH"
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_DEBUG=WARN

args=(
  --deepspeed
  --deepspeed_config /results/golden/trials/3/ds_config.json
  --tensor-model-parallel-size 4
  --pipeline-model-parallel-size 6
  --micro-batch-size 1
  --global-batch-size 96
  --zero-stage 1
  --bf16
  --num-layers 40
  --hidden-size 5120
  --ffn-hidden-size 20480
  --num-attention-heads 40
  --seq-length 2048
  --max-position-embeddings 2048
  --normalization layernorm
  --use-flash-attn-v2
  --tokenizer-type NullTokenizer
  --vocab-size 50257
  --train-iters 30
  --eval-iters 0
  --log-interval 1
  --distributed-timeout-minutes 10
  --optimizer adam
  --lr 3.0e-4
  --min-lr 3.0e-5
  --lr-decay-style cosine
  --weight-decay 0.1
  --clip-grad 1.0
  --data-path
  /data/pile_text_document
)

exec torchrun \
  --nnodes 6 \
  --node_rank 0 \
  --nproc_per_node 8 \
  --master_addr 10.0.0.1 \
  --master_port 29501 \
  /opt/Megatron-DeepSpeed/pretrain_gpt.py \
  "${args[@]}"
