#!/bin/bash
# Best config of study llama-best: tp=4,pp=1,cp=1,dp=4,vp=1,sp=1,mbs=1,gbs=64,recompute=none,distopt=1,zero=0
# 50000 iterations (tune best --emit sbatch --train-iters N to change).
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
cd RESULTS/llama-best/best || exit 97
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$first" 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
export TUNER_MASTER_ADDR=${addr:-$first}
echo "tuner: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, master $TUNER_MASTER_ADDR"
srun --ntasks-per-node=1 --kill-on-bad-exit=0 bash RESULTS/llama-best/best/slurm-node.sh RESULTS/llama-best/best
