#!/bin/bash
# The settings echosim reads from NVIDIA/Megatron-LM examples/mixtral/train_mixtral_8x7b_distributed.sh
# (commit 0a40979ee868697bd66157ab800d213ffff030d8), written out by hand: the keys and values that
# script sets which the megatron reader consumes (facts), not a copy of the script. (The script's
# sizes are a 2-layer test model, not Mixtral 8x7B.)
GPUS_PER_NODE=2
NNODES=${SLURM_NNODES:-"1"}
MODEL_ARGS=(
    --seq-length 256 --max-position-embeddings 2048 --num-layers 2 --hidden-size 256
    --ffn-hidden-size 896 --num-attention-heads 2 --attention-dropout 0.0 --hidden-dropout 0.0
    --normalization RMSNorm --position-embedding-type rope --swiglu
    --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2
)
MOE_ARGS=(--num-experts 2 --moe-router-topk 2 --overlap-grad-reduce)
DATA_ARGS=(--tokenizer-type Llama2Tokenizer)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 4)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --expert-model-parallel-size 2
    --use-distributed-optimizer --sequence-parallel
)
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    ${MODEL_ARGS[@]} ${MOE_ARGS[@]} ${DATA_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]}
