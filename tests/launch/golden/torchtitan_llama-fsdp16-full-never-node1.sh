#!/usr/bin/env bash
# Rendered by tuner for node 1 of 2: tp=1,pp=1,cp=1,dp=16,vp=1,sp=0,mbs=2,gbs=64,recompute=full:uniform:1,distopt=0,zero=0,dpr=1,sched=None,reshard=never,compile=0
# torchtitan 0.3.0: `torchrun ... -m torchtitan.train --module M --config F` (launch.script_args)
# then this trial's overrides (tuner/launch/torchtitan_flags.py). Every value went through the
# shq filter (shlex.quote): nothing in it is run by the shell.
set -euo pipefail
export PATH=/opt/venv/bin:"$PATH"
export NCCL_DEBUG=WARN

args=(
  --module
  llama3
  --config
  llama3_8b
  --training.local-batch-size 2
  --training.global-batch-size 64
  --training.seq-len 8192
  --training.steps 30
  --training.mixed-precision-param bfloat16
  --training.gc-freq 50
  --training.no-disable-cuda-graphs
  --parallelism.data-parallel-replicate-degree 1
  --parallelism.data-parallel-shard-degree 16
  --parallelism.fsdp-reshard-after-forward never
  --parallelism.tensor-parallel-degree 1
  --parallelism.no-enable-sequence-parallel
  --parallelism.pipeline-parallel-degree 1
  --parallelism.context-parallel-degree 1
  --compile.no-enable
  --compile.no-enable-async-tensor-parallel
  --metrics.log-freq 1
  activation-checkpoint:full
)

exec torchrun \
  --nnodes 2 \
  --node_rank 1 \
  --nproc_per_node 8 \
  --master_addr 10.0.0.1 \
  --master_port 29501 \
  -m torchtitan.train \
  "${args[@]}"
