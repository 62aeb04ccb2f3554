#!/bin/bash
# The settings echosim reads from NVIDIA/Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh
# (commit 157006d6d9bf4f55c0d4d7dacbd2b65e7bd84dc9), written out by hand: the keys and values that
# script sets which the megatron reader consumes (facts), not a copy of the script.
GPUS_PER_NODE=8
NUM_NODES=1
MODEL=(--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048
       --max-position-embeddings 2048 --attention-backend auto)
TRAIN=(--micro-batch-size 1 --global-batch-size 1536 --fp16 --vocab-file gpt2-vocab.json)
PARALLEL=(--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16)
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES pretrain_gpt.py ${MODEL[@]} ${TRAIN[@]} ${PARALLEL[@]}
