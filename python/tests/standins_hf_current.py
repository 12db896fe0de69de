"""Stand-in for the current Hugging Face ViT (transformers' `models/vit/modeling_vit.py` since the
attention-interface refactor), next to the older release modelled in standins.py.

What changed, and what the dumper has to cope with:
  * attention is computed by a module-level function chosen by `config._attn_implementation`
    ("sdpa" by default, a kernel that never forms the weights; "eager" runs
    `eager_attention_forward`, which forms them and applies *functional* dropout);
  * ViTSelfAttention keeps `scaling` and `dropout_prob` but has no `dropout` module;
  * its forward always returns (context, weights); weights are None except on the eager path;
  * the model collects the weights for `output_attentions=True` from the ViTSelfAttention
    outputs (transformers records them with hooks; done here the same way).
Structure and names follow the library; the code is this project's own.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from standins import ViTEmbeddings, ViTSelfOutput, hf_config as _old_config


def hf_config(**kw):
    cfg = _old_config(**kw)
    cfg._attn_implementation = "sdpa"  # what from_pretrained / from_config pick where torch has it
    cfg.output_attentions = False
    return cfg


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0,
                            **kwargs):
    weights = torch.softmax((query @ key.transpose(-1, -2)) * scaling, dim=-1, dtype=torch.float32)
    weights = F.dropout(weights.to(query.dtype), p=dropout, training=module.training)
    if attention_mask is not None:
        weights = weights * attention_mask
    return (weights @ value).transpose(1, 2).contiguous(), weights


def sdpa_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           **kwargs):
    """Stands for F.scaled_dot_product_attention (absent in torch 1.13): calls no submodule and
    returns no weights."""
    out = torch.softmax((query * scaling) @ key.transpose(-1, -2), dim=-1) @ value
    return out.transpose(1, 2).contiguous(), None


ATTENTION_FUNCTIONS = {"sdpa": sdpa_attention_forward}


class ViTSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.dropout_prob = config.attention_probs_dropout_prob
        self.scaling = self.attention_head_size ** -0.5
        self.is_causal = False
        self.query = nn.Linear(config.hidden_size, self.all_head_size, bias=config.qkv_bias)
        self.key = nn.Linear(config.hidden_size, self.all_head_size, bias=config.qkv_bias)
        self.value = nn.Linear(config.hidden_size, self.all_head_size, bias=config.qkv_bias)

    def forward(self, hidden_states, head_mask=None):
        b = hidden_states.shape[0]
        shape = (b, -1, self.num_attention_heads, self.attention_head_size)
        key = self.key(hidden_states).view(*shape).transpose(1, 2)
        value = self.value(hidden_states).view(*shape).transpose(1, 2)
        query = self.query(hidden_states).view(*shape).transpose(1, 2)
        attend = eager_attention_forward
        if self.config._attn_implementation != "eager":
            attend = ATTENTION_FUNCTIONS[self.config._attn_implementation]
        context, weights = attend(self, query, key, value, head_mask, is_causal=self.is_causal,
                                  scaling=self.scaling,
                                  dropout=0.0 if not self.training else self.dropout_prob)
        return context.reshape(context.shape[:-2] + (self.all_head_size,)), weights


class ViTAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = ViTSelfAttention(config)
        self.output = ViTSelfOutput(config)

    def forward(self, hidden_states, head_mask=None):
        context, _ = self.attention(hidden_states, head_mask)
        return self.output(context, hidden_states)


class ViTLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = ViTAttention(config)
        self.intermediate = nn.Sequential(nn.Linear(config.hidden_size, config.intermediate_size),
                                          nn.GELU())
        self.output_dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states, head_mask=None):
        hidden_states = self.attention(self.layernorm_before(hidden_states), head_mask) \
            + hidden_states
        return self.output_dense(self.intermediate(self.layernorm_after(hidden_states))) \
            + hidden_states


class ViTEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([ViTLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states):
        for layer in self.layer:
            hidden_states = layer(hidden_states)
        return SimpleNamespace(last_hidden_state=hidden_states)


class ViTModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = ViTEmbeddings(config)
        self.encoder = ViTEncoder(config)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values, **kwargs):
        return forward_recording(self, ViTSelfAttention, kwargs,
                                 lambda: self.encoder(self.embeddings(pixel_values)).last_hidden_state)


def forward_recording(model, attention_type, kwargs, run):
    """A ViTModel's forward: run() gives the last hidden state; with output_attentions the weights
    (each `attention_type` module's second output) are recorded, as transformers does with hooks."""
    want = kwargs.get("output_attentions", model.config.output_attentions)
    recorded, hooks = [], []
    if want:
        hooks = [m.register_forward_hook(lambda _m, _i, o: recorded.append(o[1]))
                 for m in model.modules() if isinstance(m, attention_type)]
    try:
        h = run()
    finally:
        for hk in hooks:
            hk.remove()
    return SimpleNamespace(last_hidden_state=model.layernorm(h),
                           attentions=tuple(recorded) if want else None)


class ViTForImageClassification(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.vit = ViTModel(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, pixel_values=None, labels=None, **kwargs):
        out = self.vit(pixel_values, **kwargs)
        return SimpleNamespace(logits=self.classifier(out.last_hidden_state[:, 0]),
                               attentions=out.attentions)
