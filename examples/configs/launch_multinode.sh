#!/usr/bin/env bash
# Multi-node SAGE-GRPO with FSDP2: run this script on EVERY node, with the same arguments.
#
#   NUM_NODES=4 GPUS_PER_NODE=8 NODE_RANK=<0..NUM_NODES-1> MAIN_IP=<address of node 0> \
#       examples/configs/launch_multinode.sh examples/configs/hunyuanvideo15_480p_lora_multinode_fsdp.yaml \
#       [more sage-train arguments, e.g. --max_steps 10]
#
# Under SLURM: srun --nodes=4 --ntasks-per-node=1 bash -c \
#   'NODE_RANK=$SLURM_NODEID MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1) \
#    examples/configs/launch_multinode.sh examples/configs/hunyuanvideo15_480p_lora_multinode_fsdp.yaml'
#
# Every node needs the same code, the model (or Hub access / a shared HF_HOME), the reward checkpoint and the
# prompt files at the same paths; output_dir should be on a shared file system (checkpoints are written by
# the main process).
set -euo pipefail

CONFIG=${1:?"usage: launch_multinode.sh <training config .yaml> [sage-train arguments]"}
shift
NUM_NODES=${NUM_NODES:-4}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NODE_RANK=${NODE_RANK:?"set NODE_RANK (0 on the main node)"}
MAIN_IP=${MAIN_IP:?"set MAIN_IP to the address of node 0"}
MAIN_PORT=${MAIN_PORT:-29500}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

exec accelerate launch \
    --config_file "$HERE/accelerate/fsdp2_multinode.yaml" \
    --num_machines "$NUM_NODES" \
    --num_processes "$((NUM_NODES * GPUS_PER_NODE))" \
    --machine_rank "$NODE_RANK" \
    --main_process_ip "$MAIN_IP" \
    --main_process_port "$MAIN_PORT" \
    "$(command -v sage-train)" --config "$CONFIG" "$@"
