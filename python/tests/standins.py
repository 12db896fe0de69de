"""Stand-ins for timm's and Hugging Face's ViT modules (neither library is installable here).

They reproduce the structure and attribute names that attnscope_dump.hooks relies on, as found
in timm's `timm/models/vision_transformer.py` (Attention, Block, VisionTransformer) and in
transformers' `models/vit/modeling_vit.py` (ViTSelfAttention ... ViTForImageClassification,
eager attention). Only the parts the dumper touches are kept; the computations are the
libraries' own (reimplemented here, not copied).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


def _fused_sdpa(q, k, v, scale):
    """Stand-in for F.scaled_dot_product_attention (absent in torch 1.13): like the real kernel
    it calls no submodule, so hooks on attn_drop never see the weights."""
    return torch.softmax((q * scale) @ k.transpose(-2, -1), dim=-1) @ v


# ----------------------------------------------------------------------------- timm
class TimmAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=True, qk_norm=False, scale_norm=False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = True  # timm's default where torch has SDPA
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.norm = nn.LayerNorm(dim) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_attn:
            x = _fused_sdpa(q, k, v, self.scale)
        else:
            q = q * self.scale
            attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
            attn = self.attn_drop(attn)
            x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        x = self.norm(x)
        return self.proj_drop(self.proj(x))


class TimmMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TimmBlock(nn.Module):
    def __init__(self, dim, num_heads, qk_norm, scale_norm):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = TimmAttention(dim, num_heads, qk_norm=qk_norm, scale_norm=scale_norm)
        self.ls1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = TimmMlp(dim, 2 * dim)
        self.ls2 = nn.Identity()

    def forward(self, x):
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class TimmPatchEmbed(nn.Module):
    def __init__(self, img_size, patch_size, in_chans, dim):
        super().__init__()
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, dim, patch_size, patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class TimmVisionTransformer(nn.Module):
    def __init__(self, img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=16,
                 depth=2, num_heads=2, qk_norm=False, scale_norm=False):
        super().__init__()
        self.num_prefix_tokens = 1
        self.patch_embed = TimmPatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1, embed_dim))
        self.blocks = nn.Sequential(*[TimmBlock(embed_dim, num_heads, qk_norm, scale_norm)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward_features(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.norm(self.blocks(x))

    def forward(self, x):
        return self.head(self.forward_features(x)[:, 0])


# ----------------------------------------------------------------------------- Hugging Face
def hf_config(image_size=16, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2,
              num_attention_heads=2, num_labels=5):
    return SimpleNamespace(image_size=image_size, patch_size=patch_size, num_channels=num_channels,
                           hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                           num_attention_heads=num_attention_heads, num_labels=num_labels,
                           intermediate_size=2 * hidden_size, qkv_bias=True,
                           attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
                           layer_norm_eps=1e-12)


class ViTSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size, bias=config.qkv_bias)
        self.key = nn.Linear(config.hidden_size, self.all_head_size, bias=config.qkv_bias)
        self.value = nn.Linear(config.hidden_size, self.all_head_size, bias=config.qkv_bias)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def transpose_for_scores(self, x):
        x = x.view(x.size()[:-1] + (self.num_attention_heads, self.attention_head_size))
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, head_mask=None, output_attentions=False):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        scores = scores / math.sqrt(self.attention_head_size)
        probs = self.dropout(F.softmax(scores, dim=-1))
        context = torch.matmul(probs, value_layer).permute(0, 2, 1, 3).contiguous()
        context = context.view(context.size()[:-2] + (self.all_head_size,))
        return (context, probs) if output_attentions else (context,)


class ViTSelfOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        return self.dropout(self.dense(hidden_states))


class ViTAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = ViTSelfAttention(config)
        self.output = ViTSelfOutput(config)

    def forward(self, hidden_states):
        return self.output(self.attention(hidden_states)[0], hidden_states)


class ViTLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = ViTAttention(config)
        self.intermediate = nn.Sequential(nn.Linear(config.hidden_size, config.intermediate_size),
                                          nn.GELU())
        self.output_dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        hidden_states = self.attention(self.layernorm_before(hidden_states)) + hidden_states
        return self.output_dense(self.intermediate(self.layernorm_after(hidden_states))) \
            + hidden_states


class ViTEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList([ViTLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states):
        for layer in self.layer:
            hidden_states = layer(hidden_states)
        return hidden_states


class ViTEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        n = (config.image_size // config.patch_size) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, config.hidden_size))
        self.projection = nn.Conv2d(config.num_channels, config.hidden_size, config.patch_size,
                                    config.patch_size)
        self.position_embeddings = nn.Parameter(torch.randn(1, n + 1, config.hidden_size))

    def forward(self, pixel_values):
        x = self.projection(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + self.position_embeddings


class ViTModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = ViTEmbeddings(config)
        self.encoder = ViTEncoder(config)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values):
        h = self.layernorm(self.encoder(self.embeddings(pixel_values)))
        return SimpleNamespace(last_hidden_state=h)


class ViTForImageClassification(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.vit = ViTModel(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, pixel_values):
        h = self.vit(pixel_values).last_hidden_state
        return SimpleNamespace(logits=self.classifier(h[:, 0]))


# ----------------------------------------------------------------------------- timm with RoPE
class TimmRotaryEmbedding(nn.Module):
    """Like timm's rotary embeddings for EVA / vit_*_rope_* models: the model holds it as `rope`
    and passes its output (sin and cos per patch token, concatenated) to every attention."""

    def __init__(self, head_dim, grid):
        super().__init__()
        self.head_dim, self.grid = head_dim, grid

    def forward(self):
        quarter = self.head_dim // 4
        freqs = 1.0 / (10.0 ** (torch.arange(quarter, dtype=torch.float32) / quarter))
        ys, xs = torch.meshgrid(torch.arange(self.grid[0]), torch.arange(self.grid[1]),
                                indexing="ij")
        ang = torch.cat([ys.reshape(-1, 1) * freqs, xs.reshape(-1, 1) * freqs], dim=1)
        ang = ang.repeat_interleave(2, dim=1)  # [tokens, head_dim]
        return torch.cat([ang.sin(), ang.cos()], dim=-1)


def _rotate(x, rope):
    sin, cos = rope.chunk(2, dim=-1)
    pairs = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape(x.shape)
    return x * cos + pairs * sin


class TimmRopeAttention(TimmAttention):
    """timm's AttentionRope: q and k of the patch tokens are rotated after q_norm/k_norm."""

    def __init__(self, dim, num_heads, num_prefix_tokens=1):
        super().__init__(dim, num_heads)
        self.num_prefix_tokens = num_prefix_tokens

    def forward(self, x, rope=None):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim) \
            .permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            p = self.num_prefix_tokens
            q = torch.cat([q[:, :, :p], _rotate(q[:, :, p:], rope)], dim=2)
            k = torch.cat([k[:, :, :p], _rotate(k[:, :, p:], rope)], dim=2)
        if self.fused_attn:
            x = _fused_sdpa(q, k, v, self.scale)
        else:
            attn = self.attn_drop(((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1))
            x = attn @ v
        return self.proj(self.norm(x.transpose(1, 2).reshape(B, N, C)))


class TimmRopeBlock(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = TimmRopeAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = TimmMlp(dim, 2 * dim)

    def forward(self, x, rope=None):
        x = x + self.attn(self.norm1(x), rope=rope)
        return x + self.mlp(self.norm2(x))


class TimmEva(nn.Module):
    """The shape of timm's Eva with use_rot_pos_emb (rope=True) or without (rope=False)."""

    def __init__(self, img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=16,
                 depth=2, num_heads=2, rope=True):
        super().__init__()
        self.num_prefix_tokens = 1
        self.patch_embed = TimmPatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1, embed_dim))
        self.rope = TimmRotaryEmbedding(embed_dim // num_heads, self.patch_embed.grid_size) \
            if rope else None
        self.blocks = nn.ModuleList([TimmRopeBlock(embed_dim, num_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        rope = self.rope() if self.rope is not None else None
        for blk in self.blocks:
            x = blk(x, rope=rope)
        return self.head(self.norm(x)[:, 0])
