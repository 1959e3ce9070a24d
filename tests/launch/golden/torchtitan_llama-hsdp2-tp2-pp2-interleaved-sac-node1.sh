#!/usr/bin/env bash
# Rendered by tuner for node 1 of 2: tp=2,pp=2,cp=1,dp=4,vp=2,sp=1,mbs=1,gbs=64,recompute=selective,distopt=0,zero=0,tpo=1,dpr=2,sched=Interleaved1F1B,reshard=default,compile=1
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
  --training.local-batch-size 16
  --training.global-batch-size 64
  --training.seq-len 8192
  --training.steps 30
  --training.mixed-precision-param bfloat16
  --training.gc-freq 50
  --training.disable-cuda-graphs
  --parallelism.data-parallel-replicate-degree 2
  --parallelism.data-parallel-shard-degree 2
  --parallelism.fsdp-reshard-after-forward default
  --parallelism.tensor-parallel-degree 2
  --parallelism.enable-sequence-parallel
  --parallelism.pipeline-parallel-degree 2
  --parallelism.context-parallel-degree 1
  --parallelism.pipeline-parallel-schedule Interleaved1F1B
  --parallelism.pipeline-parallel-microbatch-size 1
  --compile.enable
  --compile.enable-async-tensor-parallel
  --metrics.log-freq 1
  activation-checkpoint:selective
)

exec torchrun \
  --nnodes 2 \
  --node_rank 1 \
  --nproc_per_node 8 \
  --master_addr 10.0.0.1 \
  --master_port 29501 \
  -m torchtitan.train \
  "${args[@]}"
