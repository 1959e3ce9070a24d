#!/bin/bash
# Full run of study llama-best, trial 1 (the fastest measured trial).
# Config: tp4 pp1 dp4 sp mbs1 ga16 distopt
# Config key: tp=4,pp=1,cp=1,dp=4,vp=1,sp=1,mbs=1,gbs=64,recompute=none,distopt=1,zero=0
# Framework: megatron, template megatron_gpt; 2 node(s) x 8 GPUs per node.
# Measured by trial 1 over 30 iterations (the first 5 skipped): 2.000 s/step (median), 131,072
#   tokens/s.
# Predicted: nothing recorded.
# Software: tuner VERSION (the trial's logs name no framework version).
# This run: 50000 iterations (tune best --train-iters N to change); launch.train_args:
#   --data-path /data/corpus_text_document --lr 1e-4.
# Environment: none set by the study (as the trial ran; see each node).
# A short trial does not measure: evaluation, checkpoint saving and loading, data loading at
#   scale (trials read mock or cached data), the learning-rate schedule's effect on convergence,
#   or a long run's stability (memory growth, stragglers, failing nodes).
# Submit with: sbatch <this file>. No --time: the partition's default limit applies;
# add '#SBATCH --time=...' for a run longer than that.
#SBATCH --job-name=llama-best-best
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --partition=gpu
#SBATCH --account=proj-1
#SBATCH --qos=high
#SBATCH --gres=gpu:8
#SBATCH --constraint=h100
# cluster.slurm.setup
module load cuda/12.4
# the master address: the first node of the job (its NodeAddr), for every node
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$first" 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
export MASTER_ADDR=${addr:-$first}
srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash RESULTS/llama-best/exports/trial-1/sbatch-node.sh
