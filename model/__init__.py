"""Llama decoder with switchable attention (FPA or SageBwd), QK-norm, Q/K smoothing and SageBwd's quantisation contract."""
from model.attention import CausalSelfAttention, CoreAttention
from model.config import GPT2_VOCAB_SIZE, PRESETS, ModelConfig, model_config_from_preset
from model.llama import Block, Llama, count_parameters

__all__ = ["Block", "CausalSelfAttention", "CoreAttention", "GPT2_VOCAB_SIZE", "Llama",
           "ModelConfig", "PRESETS", "count_parameters", "model_config_from_preset"]
