#!/bin/bash
# The settings echosim reads from NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh
# (commit 157006d6d9bf4f55c0d4d7dacbd2b65e7bd84dc9), written out by hand: the keys and values that
# script sets which the megatron reader consumes (facts), not a copy of the script. The script's
# own structure is kept where the reader must follow it: variables with defaults, arrays, and an
# if on the data source (run without arguments: mock data).
GPUS_PER_NODE=8
NUM_NODES=1
TOKENIZER_ARG=${3:-"MOCK"}
TP_SIZE=1
CP_SIZE=1
DTYPE="fp8"
MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192
    --max-position-embeddings 8192 --position-embedding-type rope --attention-backend fused
    --swiglu --untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0
)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128 --bf16)
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=("--fp8-format hybrid")
fi
MODEL_PARALLEL_ARGS=(--tensor-model-parallel-size $TP_SIZE --context-parallel-size $CP_SIZE --sequence-parallel)
TRAINING_ARGS+=(--use-distributed-optimizer --overlap-grad-reduce)
if [[ "$TOKENIZER_ARG" == "MOCK" ]]; then
    DATA_ARGS=("--tokenizer-type NullTokenizer" "--vocab-size 128256")
else
    DATA_ARGS=("--tokenizer-type HuggingFaceTokenizer" "--vocab-size 128256")
fi
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES pretrain_gpt.py \
    ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${DTYPE_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${DATA_ARGS[@]}
