#!/usr/bin/env bash
# Rendered by tuner for node 1 of 2: tp=1,pp=1,cp=2,dp=8,vp=1,sp=0,mbs=2,gbs=64,recompute=selective,distopt=0,zero=0
# Every value below went through the shq filter (shlex.quote): nothing in it is run by the shell.
set -euo pipefail
# The nodes' python first, so torchrun and the extension builds (ninja) come from the same venv.
export PATH=/opt/venv/bin:"$PATH"
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_DEBUG=WARN

args=(
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --context-parallel-size 2
  --micro-batch-size 2
  --global-batch-size 64
  --recompute-granularity selective
  --overlap-grad-reduce
  --bf16
  --num-layers 32
  --hidden-size 4096
  --ffn-hidden-size 14336
  --num-attention-heads 32
  --group-query-attention
  --num-query-groups 8
  --seq-length 8192
  --max-position-embeddings 8192
  --swiglu
  --untie-embeddings-and-output-weights
  --normalization RMSNorm
  --position-embedding-type rope
  --disable-bias-linear
  --attention-dropout 0
  --hidden-dropout 0
  --mock-data
  --tokenizer-type NullTokenizer
  --vocab-size 128256
  --train-iters 30
  --eval-iters 0
  --log-interval 1
  --log-throughput
  --distributed-timeout-minutes 10
  --lr 3.0e-4
  --min-lr 3.0e-5
  --lr-decay-style cosine
  --weight-decay 0.1
  --clip-grad 1.0
)

exec torchrun \
  --nnodes 2 \
  --node_rank 1 \
  --nproc_per_node 8 \
  --master_addr 10.0.0.1 \
  --master_port 29501 \
  /opt/Megatron-LM/pretrain_gpt.py \
  "${args[@]}"
