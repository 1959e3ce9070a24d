#!/bin/bash
# Written by tuner for trial 3.
#SBATCH --job-name=tuner-t3-0123abcd
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=25
#SBATCH --exclusive
#SBATCH --partition=gpu
#SBATCH --account=proj-1
#SBATCH --qos=high
#SBATCH --gres=gpu:8
#SBATCH --constraint=h100
export TUNER_TRIAL_TOKEN=0123abcd
export NCCL_DEBUG='INFO it'"'"'s'
# cluster.slurm.setup
module load cuda/12.4
cd '/results/a b '"'"'c'"'"'; echo pwned/golden/trials/3' || exit 97
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$first" 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
export TUNER_MASTER_ADDR=${addr:-$first}
echo "tuner: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, master $TUNER_MASTER_ADDR"
srun --ntasks-per-node=1 --kill-on-bad-exit=0 '--container-image=nvcr.io#nvidia/pytorch:24.05-py3' --container-mounts=/lustre:/lustre bash '/results/a b '"'"'c'"'"'; echo pwned/golden/trials/3/slurm-node.sh' '/results/a b '"'"'c'"'"'; echo pwned/golden/trials/3'
