#!/bin/bash
# A sharded run (`fedcore simulate`) on two nodes of a Slurm cluster, one rank a node,
# started by torchrun with its c10d rendezvous on the first node (docs/engines.md, "Across
# machines"). Submit from a checkout where fedcore is installed on every node:
#
#   sbatch examples/ranks/slurm.sh examples/dpsgd.toml
#
# Rank 0 writes the results to runs/ranks-<job id> (a folder every node sees, or rank 0's).
#SBATCH --job-name=fedcore-ranks
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --time=01:00:00
set -euo pipefail
config="${1:-examples/dpsgd.toml}"
head="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
port="${FEDCORE_RENDEZVOUS_PORT:-29500}" # a free TCP port of the first node
# GLOO_SOCKET_IFNAME: the interface the nodes share, where it is not the first one gloo finds.
srun torchrun \
    --nnodes="$SLURM_NNODES" --nproc-per-node=1 \
    --rdzv-id="$SLURM_JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$head:$port" \
    -m fedcore simulate --quiet --threads auto --out "runs/ranks-$SLURM_JOB_ID" "$config"
