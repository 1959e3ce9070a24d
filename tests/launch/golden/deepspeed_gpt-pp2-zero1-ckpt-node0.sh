#!/usr/bin/env bash
# Rendered by tuner for node 0 of 2: tp=1,pp=2,cp=1,dp=2,vp=1,sp=0,mbs=1,gbs=16,recompute=full:uniform:1,distopt=0,zero=1
# Every value below went through the shq filter (shlex.quote): nothing in it is run by the shell.
set -euo pipefail
# The nodes' python first: torchrun, and ninja for DeepSpeed's op builds, come from the same venv.
export PATH=/opt/venv/bin:"$PATH"
export NCCL_DEBUG=WARN

args=(
  --deepspeed_config /results/golden/trials/3/ds_config.json
  --num-layers 4
  --hidden-size 128
  --num-attention-heads 4
  --ffn-hidden-size 512
  --seq-length 128
  --vocab-size 1024
  --train-iters 30
)

exec torchrun \
  --nnodes 2 \
  --node_rank 0 \
  --nproc_per_node 2 \
  --master_addr 10.0.0.1 \
  --master_port 29501 \
  workloads/gpt_deepspeed.py \
  "${args[@]}"
