#!/usr/bin/env bash
# Rendered by tuner for node 0 of 2: tp=2,pp=2,cp=1,dp=4,vp=1,sp=1,mbs=1,gbs=64,recompute=none,distopt=1,zero=0,ep=8,etp=1,dispatcher=alltoall
# Every value below went through the shq filter (shlex.quote): nothing in it is run by the shell.
set -euo pipefail
# The nodes' python first, so torchrun and the extension builds (ninja) come from the same venv.
export PATH=/opt/venv/bin:"$PATH"
export CUDA_DEVICE_MAX_CONNECTIONS=1

args=(
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 2
  --context-parallel-size 1
  --sequence-parallel
  --micro-batch-size 1
  --global-batch-size 64
  --overlap-grad-reduce
  --use-distributed-optimizer
  --overlap-param-gather
  --num-experts 64
  --moe-router-topk 6
  --moe-ffn-hidden-size 1408
  --moe-layer-freq '([0]*1+[1]*27)'
  --moe-shared-expert-intermediate-size 2816
  --moe-aux-loss-coeff 0.001
  --moe-grouped-gemm
  --expert-model-parallel-size 8
  --expert-tensor-parallel-size 1
  --moe-token-dispatcher-type alltoall
  --bf16
  --fp8-format hybrid
  --fp8-recipe blockwise
  --num-layers 28
  --hidden-size 2048
  --ffn-hidden-size 10944
  --num-attention-heads 16
  --seq-length 4096
  --max-position-embeddings 4096
  --swiglu
  --untie-embeddings-and-output-weights
  --normalization RMSNorm
  --position-embedding-type rope
  --disable-bias-linear
  --attention-dropout 0
  --hidden-dropout 0
  --mock-data
  --tokenizer-type NullTokenizer
  --vocab-size 102400
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
  --node_rank 0 \
  --nproc_per_node 8 \
  --master_addr 10.0.0.1 \
  --master_port 29501 \
  /opt/Megatron-LM/pretrain_gpt.py \
  "${args[@]}"
