"""Stand-in for the Hugging Face ViT of transformers 5 (seen in transformers 5.17.0): no encoder
module, the model's own list `layers`, and each layer's `attention` is one module with `q_proj`, `k_proj`, `v_proj`
and `o_proj` Linears that applies the output projection itself, returning (projected output,
weights); weights exist on the eager path only. Built on standins_hf_current's attention
functions; structure and names follow the library, the code is this project's own.
"""
from __future__ import annotations

from torch import nn

import standins_hf_current as current
from standins import ViTEmbeddings

hf_config = current.hf_config


class ViTAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim ** -0.5
        self.dropout_prob = config.attention_probs_dropout_prob
        inner = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, inner, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, inner, bias=config.qkv_bias)
        self.o_proj = nn.Linear(inner, config.hidden_size)

    def forward(self, hidden_states):
        b = hidden_states.shape[0]
        shape = (b, -1, self.num_heads, self.head_dim)
        q, k, v = (m(hidden_states).view(*shape).transpose(1, 2)
                   for m in (self.q_proj, self.k_proj, self.v_proj))
        attend = current.eager_attention_forward
        if self.config._attn_implementation != "eager":
            attend = current.ATTENTION_FUNCTIONS[self.config._attn_implementation]
        context, weights = attend(self, q, k, v, None, scaling=self.scaling,
                                  dropout=0.0 if not self.training else self.dropout_prob)
        return self.o_proj(context.reshape(context.shape[:-2] + (-1,))), weights


class ViTLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = ViTAttention(config)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, config.intermediate_size), nn.GELU(),
                                 nn.Linear(config.intermediate_size, config.hidden_size))
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        hidden_states = self.attention(self.layernorm_before(hidden_states))[0] + hidden_states
        return self.mlp(self.layernorm_after(hidden_states)) + hidden_states


class ViTModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = ViTEmbeddings(config)
        self.layers = nn.ModuleList([ViTLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values, **kwargs):
        def run():
            h = self.embeddings(pixel_values)
            for layer in self.layers:
                h = layer(h)
            return h
        return current.forward_recording(self, ViTAttention, kwargs, run)
