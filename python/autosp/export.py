"""Export a PyTorch causal language model to a .pt2 archive that `autosp import` reads.

    from autosp.export import export
    export(model, "model.pt2")          # model(input_ids, labels=...) -> .loss, e.g. transformers
    export(model, "model.pt2", vocab_size=V)  # a plain module: forward(input_ids, labels) -> loss

The model code is not changed. What this does, and nothing else:
  - registers `autosp::attention(q, k, v, causal, scale, window, softcap=0, sinks=None)`, a PyTorch custom
    op whose eager implementation is scaled_dot_product_attention (with a softcap c > 0, Gemma
    2's, the scores written out: c tanh(scale q.k / c) before the softmax), and, for
    transformers models, an
    attention function "autosp" (transformers' AttentionInterface) that calls it and a mask
    function "autosp" (AttentionMaskInterface) that builds no mask: attention is then one
    node in the exported graph instead of a B x 1 x S x S mask subgraph, and autosp's
    compiler shards it (causal, sliding window, softcap, gpt-oss's sinks: a learned logit per head
    in each row's softmax, the model's `s_aux`); and `autosp::moe(x, router_logits,
    gate[], up[], down[], top_k, normalize)`, the mixture-of-experts layer autosp's moe op runs
    (its eager implementation computes every expert densely, weighted 0 where not chosen: the
    same sum, traceable), and `autosp::moe_stacked(x, router_logits, gate_up, down, top_k,
    normalize, ...)`, the same of transformers 5's stacked experts with its routers (sigmoid
    scores, groups, a scale, a correction bias), and `autosp::moe_gpt_oss(x, router_logits, gate_up,
    gate_up_bias, down, down_bias, top_k, alpha, limit)`, gpt-oss's experts as it keeps them;
  - exports `forward(input_ids, labels) -> loss` with torch.export.export, the batch and the
    sequence length dynamic (a module with LayerDrop 0, OPT's decoder, in eval mode alone while
    it does: its train-mode draw of torch.rand cannot be traced; LayerDrop above 0 is refused),
    and saves it with torch.export.save, a transformers model's
    config.json beside the graph (the archive's extra/config.json), so that autosp's
    checkpoints of the program are model directories transformers loads. A model that cuts
    its positions from a table of its config's length L (MPT's ALiBi, GPT-Neo's mask) makes
    torch.export refuse the length L itself (a guard S != L: the cut of the whole table is
    another view than a cut of part of it); export() then exports lengths up to L - 1 and
    says so. A guard that the sequence is at least N long (N <= 16: a model's own label shift)
    is taken likewise;
  - while exporting, computes these in a form torch.export traces or autosp reads, the
    same numbers: longrope (Phi-3's rotary), which transformers switches to its long factors by
    a Python `if` on the positions, chooses them by the sequence length in the program
    (_LongRopeByLength), so that autosp takes the factors of the length it trains;
    nn.MultiheadAttention used as batch-first self-attention runs in the [B, H, S, D] layout
    (_BatchFirstSelfAttention: its own merges the heads into the batch);
    nn.TransformerEncoder's guess whether its mask is causal (a data-dependent torch.equal)
    answers only what it was told; DeepSeek-V3's interleaved rotary is GLM's, its permutation of
    q's and k's rotary parts dropped (the scores do not see it), and its keys assembled in an
    empty tensor their cat (_InterleavedRopeOfLatentAttention, each checked on a sample); gpt-oss's
    rotary of each frequency once, rotating the halves itself, is Llama's form with tables
    cat(t, t), the same bits (_HalfTablesRope, checked on a sample); and
    transformers' sparse mixture-of-experts blocks (Mixtral's, Qwen2/3-MoE's, OLMoE's,
    Qwen2-MoE's, Ernie 4.5-MoE's, HunYuan-MoE's, GraniteMoE's, GLM-4.5-MoE's, DeepSeek-V3's,
    gpt-oss's, in transformers 4's and 5's forms), whose loop over the experts hit torch.export cannot
    trace, are their router's logits and one `autosp::moe`, `autosp::moe_stacked` or
    `autosp::moe_gpt_oss` node of the
    experts' weights, with the routing the check against the block's own forward finds
    (_SparseMoeBlocks), and their load-balancing loss, where the config asks for it
    (output_router_logits), one `autosp::moe_balance` node (_LoadBalancingLoss).
Models that call torch.nn.functional.scaled_dot_product_attention(is_causal=True) themselves
need none of the registration; autosp reads that node as it is, and attention written out
(softmax(q @ k^T * scale + mask) @ v, GPT-J's) or SDPA given a mask tensor, where the mask it
evaluates is the causal one.

Notes: export() switches `model` to the "autosp" attention and to train mode (take a reference
copy before, if one is needed); loading the .pt2 back in Python (torch.export.load) needs
register() first, for the custom op. The archive keeps each node's stack trace (autosp's
errors quote the model's source line from it), which names the source files' paths.
"""
import inspect
import json
import math
import re
import warnings

import torch
import torch.utils.checkpoint

_registered = False


def _attention_reference(q, k, v, causal: bool, scale: float, window: int, softcap: float = 0.0, sinks=None,
                         chunk: int = 0, temperature: list[float] = ()):
    # q [B, H, S, D], k [B, KV, S, D] and v [B, KV, S, Dv] (grouped-query attention: H a multiple
    # of KV; Dv the values' head dim, D or another, DeepSeek-V3's). sinks [H] (gpt-oss's): one
    # more score per row, of a key whose value is zero. chunk C > 0 (Llama 4's chunked attention):
    # each query sees only the keys of its own chunk of C positions. temperature [F, A] (Llama 4's
    # NoPE layers): query i scaled by log1p(floor((i + 1) / F)) A + 1, in f32 as transformers.
    if len(temperature):
        i = torch.arange(q.shape[2], device=q.device, dtype=torch.float32)
        f = torch.log1p(torch.floor((i + 1.0) / temperature[0])) * temperature[1] + 1.0
        q = (q * f.view(1, 1, -1, 1)).to(q.dtype)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    s = q.shape[2]
    keep = None
    if window > 0 or chunk > 0 or (causal and softcap > 0):
        i = torch.arange(s, device=q.device)
        keep = i[None, :] <= i[:, None]
        if window > 0:
            keep = keep & (i[:, None] - i[None, :] < window)
        if chunk > 0:
            keep = keep & (i[:, None] // chunk == i[None, :] // chunk)
    if softcap > 0 or sinks is not None:  # SDPA has neither: the scores written out
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        if keep is None and causal:
            i = torch.arange(s, device=q.device)
            keep = i[None, :] <= i[:, None]
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        if sinks is None:
            return torch.matmul(torch.softmax(scores, dim=-1), v)
        sink = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, s, 1).to(scores.dtype)
        p = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        return torch.matmul(p, v)
    if keep is not None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _moe_reference(x, router_logits, gate, up, down, top_k: int, normalize: bool, score="softmax", groups=1,
                   topk_group=1, group_score="max", dropped="-inf", scale=1.0, norm_eps=0.0, bias=(),
                   zero_experts: int = 0):
    # x [T, H], router_logits [T, E]; expert e is down[e](silu(gate[e] x) * up[e] x). Each token's
    # top_k experts by their scores s (softmax probabilities, or each logit's sigmoid) plus `bias`,
    # among the experts of its `topk_group` best `groups` (each scored by its best or, "top2", its
    # two best; the others' "-inf" or "zero"), weighted by s (normalize: over the chosen ones' sum
    # plus norm_eps), times scale, summed in ascending expert order (autosp's moe op). Written
    # densely (every expert on every row, weight 0 where not chosen: exactly the sparse sum) so
    # that it traces without data-dependent shapes. zero_experts Z (LongCat-Flash's): the last Z
    # of the experts the logits score are the identity (no weights; len(gate) is the others').
    if not len(gate) == len(up) == len(down):
        raise ValueError(f"autosp::moe: {len(gate)} gate, {len(up)} up and {len(down)} down weights: one of each "
                         f"per expert")
    logits = router_logits.float()
    p = torch.softmax(logits, dim=-1) if score == "softmax" else torch.sigmoid(logits)
    c = p + torch.tensor(list(bias), dtype=p.dtype, device=p.device) if len(bias) else p
    if groups > 1:
        E = p.shape[-1]
        by_group = c.view(-1, groups, E // groups)
        g = by_group.topk(2, dim=-1)[0].sum(dim=-1) if group_score == "top2" else by_group.max(dim=-1).values
        kept = torch.zeros_like(g).scatter(1, torch.topk(g, topk_group, dim=-1)[1], 1.0).bool()
        kept = kept.unsqueeze(-1).expand(-1, groups, E // groups).reshape(-1, E)
        c = c.masked_fill(~kept, 0.0 if dropped == "zero" else float("-inf"))
    chosen = torch.topk(c, top_k, dim=-1)[1]
    w = p.gather(-1, chosen)
    if normalize:
        w = w / (w.sum(dim=-1, keepdim=True) + norm_eps)
    w = w * scale
    dense = torch.zeros_like(p).scatter(-1, chosen, w).to(x.dtype)
    out = torch.zeros_like(x)
    for e in range(len(gate)):
        h = torch.nn.functional.silu(x @ gate[e].T) * (x @ up[e].T)
        out = out + (h @ down[e].T) * dense[..., e:e + 1]
    for e in range(len(gate), len(gate) + zero_experts):
        out = out + x * dense[..., e:e + 1]
    return out


def _moe_stacked_reference(x, router_logits, gate_up, down, top_k: int, normalize: bool, score: str = "softmax",
                           groups: int = 1, topk_group: int = 1, group_score: str = "max", dropped: str = "-inf",
                           scale: float = 1.0, norm_eps: float = 0.0, bias: list[float] = (),
                           transposed: bool = False, zero_experts: int = 0):
    # transformers 5's experts: gate_up [E, 2 I, H] (expert e's gate rows, then its up rows) and
    # down [E, H, I]; the same layer as _moe_reference, with its routers. transposed (Aria's, Llama
    # 4's layout): gate_up [E, H, 2 I] (the gate's columns, then the up's) and down [E, I, H].
    if transposed:
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    inter = down.shape[-1]
    return _moe_reference(x, router_logits, list(gate_up[:, :inter]), list(gate_up[:, inter:]), list(down), top_k,
                          normalize, score, groups, topk_group, group_score, dropped, scale, norm_eps, bias,
                          zero_experts)


def _moe_apart_reference(x, router_logits, gate, up, down, top_k: int, normalize: bool):
    # DBRX's experts: gate, up and down [E, I, H] (each expert's down transposed: its w2); the
    # softmax top-k routing of _moe_reference.
    return _moe_reference(x, router_logits, list(gate), list(up), [d.T for d in down], top_k, normalize)


def _moe_gpt_oss_reference(x, router_logits, gate_up, gate_up_bias, down, down_bias, top_k: int, alpha: float,
                           limit: float):
    # gpt-oss's experts: gate_up [E, H, 2 I] (gate and up columns interleaved), down [E, I, H], with
    # biases, the clamped GLU (uc + 1) c sigmoid(alpha c), c = min(g, limit), uc = clamp(u, +-limit);
    # each token's top_k experts by its logits, weighted by the softmax of those (autosp's moe op,
    # experts "gpt_oss", normalize). Dense, as _moe_reference.
    p = torch.softmax(router_logits.float(), dim=-1)
    chosen = torch.topk(p, top_k, dim=-1)[1]
    w = p.gather(-1, chosen)
    dense = torch.zeros_like(p).scatter(-1, chosen, w / w.sum(dim=-1, keepdim=True)).to(x.dtype)
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        gu = x @ gate_up[e] + gate_up_bias[e]
        c, u = gu[..., ::2].clamp(max=limit), gu[..., 1::2].clamp(min=-limit, max=limit)
        h = (u + 1) * (c * torch.sigmoid(c * alpha))
        out = out + (h @ down[e] + down_bias[e]) * dense[..., e:e + 1]
    return out


def _moe_llama4_reference(x, router_logits, gate_up, down, top_k: int):
    # Llama 4's experts: gate_up [E, H, 2 I] (the gate's columns, then the up's: torch's chunk), down
    # [E, I, H], SwiGLU; each token's top_k experts by its logits, each weighted by its logit's
    # sigmoid, which scales the expert's input (autosp's moe op, experts "llama4", weight_input).
    # Dense, as _moe_reference (an expert of input 0 gives 0: no biases).
    s = torch.sigmoid(router_logits.float())
    chosen = torch.topk(s, top_k, dim=-1)[1]
    dense = torch.zeros_like(s).scatter(-1, chosen, s.gather(-1, chosen)).to(x.dtype)
    inter = down.shape[1]
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        gu = (x * dense[..., e:e + 1]) @ gate_up[e]
        out = out + (torch.nn.functional.silu(gu[..., :inter]) * gu[..., inter:]) @ down[e]
    return out


def _moe_balance_reference(router_logits, num_experts: int, top_k: int):
    # transformers' load_balancing_loss_func without an attention mask: over the rows of every
    # layer, E sum_e (the fraction of rows whose top k include e) (their mean probability of e).
    p = torch.softmax(torch.cat(list(router_logits), dim=0), dim=-1)
    _, chosen = torch.topk(p, top_k, dim=-1)
    hits = torch.nn.functional.one_hot(chosen, num_experts).float().mean(dim=0)
    return torch.sum(hits * p.mean(dim=0).unsqueeze(0)) * num_experts


def register():
    """Registers the custom op and, when transformers is importable, its "autosp" attention."""
    global _registered
    if _registered:
        return
    torch.library.define("autosp::attention", "(Tensor q, Tensor k, Tensor v, bool causal, float scale, int window, "
                                              "float softcap=0.0, Tensor? sinks=None, int chunk=0, "
                                              "float[] temperature=[]) -> Tensor")
    torch.library.impl("autosp::attention", "CompositeImplicitAutograd")(_attention_reference)
    torch.library.define("autosp::moe", "(Tensor x, Tensor router_logits, Tensor[] gate, Tensor[] up, Tensor[] down, "
                                        "int top_k, bool normalize, str score=\"softmax\", int groups=1, "
                                        "int topk_group=1, str group_score=\"max\", str dropped=\"-inf\", "
                                        "float scale=1.0, float norm_eps=0.0, float[] bias=[], int zero_experts=0) "
                                        "-> Tensor")
    torch.library.impl("autosp::moe", "CompositeImplicitAutograd")(_moe_reference)
    torch.library.define("autosp::moe_stacked", "(Tensor x, Tensor router_logits, Tensor gate_up, Tensor down, "
                                                "int top_k, bool normalize, str score=\"softmax\", int groups=1, "
                                                "int topk_group=1, str group_score=\"max\", str dropped=\"-inf\", "
                                                "float scale=1.0, float norm_eps=0.0, float[] bias=[], "
                                                "bool transposed=False, int zero_experts=0) -> Tensor")
    torch.library.impl("autosp::moe_stacked", "CompositeImplicitAutograd")(_moe_stacked_reference)
    torch.library.define("autosp::moe_apart", "(Tensor x, Tensor router_logits, Tensor gate, Tensor up, Tensor down, "
                                              "int top_k, bool normalize) -> Tensor")
    torch.library.impl("autosp::moe_apart", "CompositeImplicitAutograd")(_moe_apart_reference)
    torch.library.define("autosp::moe_gpt_oss", "(Tensor x, Tensor router_logits, Tensor gate_up, Tensor gate_up_bias, "
                                                "Tensor down, Tensor down_bias, int top_k, float alpha, float limit) "
                                                "-> Tensor")
    torch.library.impl("autosp::moe_gpt_oss", "CompositeImplicitAutograd")(_moe_gpt_oss_reference)
    torch.library.define("autosp::moe_llama4", "(Tensor x, Tensor router_logits, Tensor gate_up, Tensor down, "
                                               "int top_k) -> Tensor")
    torch.library.impl("autosp::moe_llama4", "CompositeImplicitAutograd")(_moe_llama4_reference)
    torch.library.define("autosp::moe_balance", "(Tensor[] router_logits, int num_experts, int top_k) -> Tensor")
    torch.library.impl("autosp::moe_balance", "CompositeImplicitAutograd")(_moe_balance_reference)
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        _registered = True
        return

    def autosp_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                         sliding_window=None, **kwargs):
        if dropout:
            raise ValueError("autosp attention: attention dropout is not supported (set attention_dropout=0)")
        if attention_mask is not None and attention_mask.requires_grad:
            # The masks a model builds itself (OPT's, Persimmon's: transformers' older causal masks,
            # from the sizes alone, since export() passes no attention_mask) are the causal one
            # autosp's attention applies. A bias computed from the model's parameters (Doge's
            # dynamic mask, from the values) is not: it would be dropped silently. (export()
            # traces with every parameter requiring grad, frozen ones too.)
            raise ValueError(f"autosp attention: {type(module).__name__} passes a bias computed from its parameters "
                             f"{tuple(attention_mask.shape)} to the attention function as its mask; autosp's attention "
                             "is causal (a sliding window, chunks, sinks, a softcap) and takes no learned bias")
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        softcap = float(kwargs.get("softcap") or 0.0)
        if softcap < 0:
            raise ValueError(f"autosp attention: attention logit softcap {softcap} must be positive (or None)")
        # (values may have their own head size, DeepSeek-V3's latent attention's: autosp's
        # attention takes it, out [..., Dv])
        sinks = kwargs.get("s_aux")  # gpt-oss's attention sinks, [H]
        chunk = _attention_chunk(module)
        temperature = getattr(module, "_autosp_temperature", None)  # (_Llama4Temperature's)
        if chunk or temperature:  # Llama 4's
            out = torch.ops.autosp.attention(query, key, value, True, float(scale), int(sliding_window or 0), softcap,
                                             sinks, chunk, list(temperature or ()))
        elif sinks is not None:
            out = torch.ops.autosp.attention(query, key, value, True, float(scale), int(sliding_window or 0), softcap,
                                             sinks)
        elif softcap > 0:
            out = torch.ops.autosp.attention(query, key, value, True, float(scale), int(sliding_window or 0), softcap)
        else:  # the archives of models without a cap stay as they were
            out = torch.ops.autosp.attention(query, key, value, True, float(scale), int(sliding_window or 0))
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("autosp", autosp_attention)
    AttentionMaskInterface.register("autosp", lambda *args, **kwargs: None)
    _registered = True


def _attention_chunk(module):
    """Llama 4's chunk of a chunked-attention layer (its config's attention_chunk_size, where its
    layer_types say "chunked_attention"), else 0."""
    config, layer = getattr(module, "config", None), getattr(module, "layer_idx", None)
    types = getattr(config, "layer_types", None)
    if not isinstance(layer, int) or not types or layer >= len(types) or types[layer] != "chunked_attention":
        return 0
    chunk = getattr(config, "attention_chunk_size", None)
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"autosp export: {type(module).__name__} (layer {layer}) is a chunked-attention layer, but "
                         f"its config's attention_chunk_size is {chunk!r}")
    return chunk


class _Llama4Temperature:
    """While exporting: Llama 4's NoPE layers (attn_temperature_tuning) scale each query by
    log1p(floor((i + 1) / floor_scale)) attn_scale + 1 of its position i (cache_position) before
    attention. The attention op does that itself (autosp::attention's temperature, as the
    attention function reads it from the module), so the module's own scaling is switched off."""

    def __init__(self, model):
        self.model, self.saved = model, []

    def __enter__(self):
        for module in self.model.modules():
            if type(module).__name__ == "Llama4TextAttention" and getattr(module, "attn_temperature_tuning", False) \
                    and not module.use_rope:
                module._autosp_temperature = (float(module.floor_scale), float(module.attn_scale))
                module.attn_temperature_tuning = False
                self.saved.append(module)
        return self

    def __exit__(self, *exc):
        for module in self.saved:
            module.attn_temperature_tuning = True
            del module._autosp_temperature
        return False


class _LossOf(torch.nn.Module):
    """forward(input_ids, labels) -> the model's loss: its output's .loss (transformers'), or the
    output itself (a plain module's forward(input_ids, labels) returning the loss). use_cache=False
    only to a model whose forward takes it."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        parameters = inspect.signature(model.forward).parameters.values()
        self.cache = {"use_cache": False} if any(p.name == "use_cache" or p.kind == p.VAR_KEYWORD
                                                 for p in parameters) else {}

    def forward(self, input_ids, labels):
        out = self.model(input_ids=input_ids, labels=labels, **self.cache)
        return out.loss if hasattr(out, "loss") else out


def use_autosp_attention(model):
    """Points a transformers model (and its sub-configs) at the "autosp" attention."""
    register()
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "_attn_implementation"):
        model.set_attn_implementation("autosp") if hasattr(model, "set_attn_implementation") \
            else setattr(config, "_attn_implementation", "autosp")
    return model


class _NoLayerDrop:
    """While exporting: a module with LayerDrop (OPT's and BioGPT's decoders: `if self.training:
    if torch.rand([]) < self.layerdrop: continue`) draws a random number in train mode to skip
    layers, which torch.export cannot trace (a data-dependent branch). At layerdrop 0 the draw
    never skips, so such a module alone (not its children: their dropout and the rest keep train
    mode) is put in eval mode for the export; layerdrop > 0 would train another network each
    step, not one graph, and is refused."""

    def __init__(self, model):
        self.model = model
        self.switched = []

    def __enter__(self):
        for name, module in self.model.named_modules():
            p = getattr(module, "layerdrop", None)
            if not isinstance(p, (int, float)) or isinstance(p, bool) or not module.training:
                continue
            if p > 0:
                raise ValueError(f"autosp export: {name or type(module).__name__} drops whole layers at random "
                                 f"(layerdrop={p}); set the config's layerdrop to 0 to train it with autosp")
            module.training = False  # this module only, not its children
            self.switched.append(module)
        return self

    def __exit__(self, *exc):
        for module in self.switched:
            module.training = True
        return False


class _HalfTablesRope:
    """While exporting: gpt-oss's rotary embedding keeps each frequency once (cos and sin [..., D/2])
    and rotates the halves itself (_apply_rotary_emb: first cos - second sin, second cos + first
    sin). That is Llama's x cos + rotate_half(x) sin with the tables cat(t, t), bit for bit (a - b c
    and a + (-b) c round alike), which the importer reads as the rope op: the model's rotary
    embedding computes Llama's tables and its module's _apply_rotary_emb is Llama's form, each
    checked on a float64 sample against the original first."""

    MODULES = ("transformers.models.gpt_oss.modeling_gpt_oss",)

    def __init__(self, model):
        self.model = model
        self.saved = []

    def __enter__(self):
        import sys
        module = sys.modules.get(type(self.model).__module__)
        if module is None or module.__name__ not in self.MODULES:
            return self
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, rotate_half
        original = module._apply_rotary_emb

        def llamas(x, cos, sin):
            return x * torch.cat((cos, cos), dim=-1) + rotate_half(x) * torch.cat((sin, sin), dim=-1)

        g = torch.Generator().manual_seed(0)
        x, cos, sin = (torch.randn(2, 3, 5, n, generator=g, dtype=torch.float64) for n in (8, 4, 4))
        if not torch.equal(original(x, cos, sin), llamas(x, cos, sin)):
            raise ValueError(f"autosp export: {module.__name__}._apply_rotary_emb is not the rotation of halves "
                             f"autosp reads as its rope")
        # the tables of cat(freqs, freqs): Llama's rotary forward, checked against the model's own halves
        for rotary in [m for m in self.model.modules() if type(m).__name__.endswith("RotaryEmbedding")]:
            positions = torch.arange(6)[None]
            probe = torch.zeros(1, dtype=torch.float32, device=rotary.inv_freq.device)
            half = rotary(probe, positions)
            full = LlamaRotaryEmbedding.forward(rotary, probe, positions)
            if half[0].shape[-1] * 2 != full[0].shape[-1] or \
                    not all(torch.equal(torch.cat((h, h), dim=-1), f) for h, f in zip(half, full)):
                raise ValueError(f"autosp export: {type(rotary).__name__}'s tables are not Llama's halves")
            rotary.forward = LlamaRotaryEmbedding.forward.__get__(rotary)
            self.saved.append(rotary)
        module._apply_rotary_emb = lambda x, cos, sin: x * cos + rotate_half(x) * sin
        self.module, self.original = module, original
        return self

    def __exit__(self, *exc):
        for rotary in self.saved:
            del rotary.forward
        if self.saved or hasattr(self, "module"):
            self.module._apply_rotary_emb = self.original
        return False


class _ComplexRope:
    """While exporting: DeepSeek-V2's rotary embedding gives its tables as complex numbers
    (torch.polar, times the attention scaling) and rotates each pair (x[2i], x[2i+1]) by a complex
    product (view_as_complex), which torch.export writes as view_as_real. That product is the
    interleaved rotary x cos + rotate_half(x) sin with each frequency twice in a row (Cohere's form,
    which the importer reads as the rope op's interleaved layout): the model's rotary embedding
    computes Cohere's tables (passed on as one object, since the attention calls .to() on them)
    and its module's apply_rotary_emb is Cohere's form, checked on a sample against the original
    first (in fp32, as the original computes: to 1e-6, since the complex product may round
    otherwise)."""

    # each module's q and k layout's heads dim: DeepSeek-V2's [B, H, S, D], Llama 4's [B, S, H, D]
    MODULES = {"transformers.models.deepseek_v2.modeling_deepseek_v2": 1,
               "transformers.models.llama4.modeling_llama4": 2}

    class Tables:
        def __init__(self, cos, sin):
            self.cos, self.sin = cos, sin

        def to(self, *args, **kwargs):
            return self

    def __init__(self, model):
        self.model = model
        self.saved = []
        self.module = None

    def __enter__(self):
        import sys
        module = sys.modules.get(type(self.model).__module__)
        if module is None or module.__name__ not in self.MODULES:
            return self
        from transformers.models.cohere.modeling_cohere import CohereRotaryEmbedding, rotate_half
        original, heads = module.apply_rotary_emb, self.MODULES[module.__name__]

        def coheres(xq, xk, tables):
            cos, sin = tables.cos.unsqueeze(heads), tables.sin.unsqueeze(heads)
            return xq * cos + rotate_half(xq) * sin, xk * cos + rotate_half(xk) * sin

        rotaries = [m for m in self.model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
        g = torch.Generator().manual_seed(0)
        positions = torch.arange(6)[None].expand(2, -1)
        for rotary in rotaries:
            probe = torch.zeros(1, dtype=torch.float32, device=rotary.inv_freq.device)
            freqs_cis = rotary(probe, positions)
            cos, sin = CohereRotaryEmbedding.forward(rotary, probe, positions)
            if freqs_cis.shape[-1] * 2 != cos.shape[-1]:
                raise ValueError(f"autosp export: {type(rotary).__name__}'s tables are not one complex number per pair")
            xq, xk = (torch.randn(*((2, h, 6) if heads == 1 else (2, 6, h)), cos.shape[-1], generator=g,
                                  device=probe.device) for h in (3, 1))
            want, got = original(xq, xk, freqs_cis), coheres(xq, xk, self.Tables(cos, sin))
            if not all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(want, got)):
                raise ValueError(f"autosp export: {module.__name__}.apply_rotary_emb is not the interleaved rotary "
                                 f"autosp reads as its rope")
        for rotary in rotaries:
            rotary.forward = (lambda x, position_ids, rotary=rotary:
                              self.Tables(*CohereRotaryEmbedding.forward(rotary, x, position_ids)))
            self.saved.append(rotary)
        module.apply_rotary_emb = coheres
        self.module, self.original = module, original
        return self

    def __exit__(self, *exc):
        for rotary in self.saved:
            del rotary.forward
        if self.module is not None:
            self.module.apply_rotary_emb = self.original
        return False


class _ConcreteIsCausal:
    """While exporting: a model that calls scaled_dot_product_attention itself with
    is_causal = (mask is None and q_len > 1) (Falcon, Nemotron) passes a symbolic bool, which
    the op refuses; with the sequence at least 2 long (the export's bound) it is True, so it is
    made a bool first (torch.export guards the assumption)."""

    def __enter__(self):
        self.sdpa = torch.nn.functional.scaled_dot_product_attention
        sdpa = self.sdpa

        def concrete(*args, **kwargs):
            if isinstance(kwargs.get("is_causal"), torch.SymBool):
                kwargs["is_causal"] = bool(kwargs["is_causal"])
            return sdpa(*args, **kwargs)

        torch.nn.functional.scaled_dot_product_attention = concrete
        return self

    def __exit__(self, *exc):
        torch.nn.functional.scaled_dot_product_attention = self.sdpa
        return False


class _InterleavedRopeOfLatentAttention:
    """While exporting: DeepSeek-V3's rotary with rope_interleave (its multi-head latent
    attention; LongCat-Flash's likewise), apply_rotary_pos_emb_interleave, gathers each head's
    rotary part into its even then its odd elements (a view, transpose and reshape of five dims)
    and rotates halves; which is GLM's interleaved rotary (pairs 2i, 2i + 1 rotated by frequency
    i, in place) followed by that gathering P. Its only readers are the attention's scores, where
    q and k, both gathered by P, give the dot products P leaves alone: so it is exported as GLM's
    form, which autosp reads as the rope op's interleaved layout. The module's function is first
    checked to be P of that on a sample, and left as it is otherwise.
    transformers 5's attention there (and DeepSeek-V2's) assembles its keys in a new_empty tensor,
    its two parts copied into slices (expand_kv): exported as the torch.cat of the parts, which it
    equals (checked on a sample, bitwise)."""

    # the modules whose attention reads the function's results only through its scores
    READ_BY_SCORES = ("transformers.models.deepseek_v3.modeling_deepseek_v3",
                      "transformers.models.longcat_flash.modeling_longcat_flash")
    # the modules whose attention assembles its keys with expand_kv (DeepSeek-V2's too, whose rotary
    # is _ComplexRope's)
    EXPAND_KV = READ_BY_SCORES + ("transformers.models.deepseek_v2.modeling_deepseek_v2",)

    def __init__(self, model):
        self.model = model
        self.patched = []
        self.patched_kv = []

    @staticmethod
    def _expand_kv(attn):
        def expand_kv(kv_nope, k_rot):
            batch_size, _, seq_length, _ = kv_nope.shape
            kv = attn.kv_b_proj(kv_nope).view(batch_size, seq_length, -1, attn.qk_nope_head_dim + attn.v_head_dim)
            k_nope, value_states = torch.split(kv.transpose(1, 2), [attn.qk_nope_head_dim, attn.v_head_dim], dim=-1)
            return torch.cat((k_nope, k_rot.expand(-1, k_nope.shape[1], -1, -1)), dim=-1), value_states

        return expand_kv

    def _patch_expand_kv(self):
        for module in self.model.modules():
            if type(module).__module__ not in self.EXPAND_KV or not callable(getattr(module, "expand_kv", None)):
                continue
            expand_kv = self._expand_kv(module)
            w = module.kv_b_proj.weight
            g = torch.Generator().manual_seed(0)
            kv_nope = torch.randn(2, 1, 5, w.shape[1], generator=g).to(w)
            k_rot = torch.randn(2, 1, 5, module.qk_rope_head_dim, generator=g).to(w)
            with torch.no_grad():
                want, got = module.expand_kv(kv_nope, k_rot), expand_kv(kv_nope, k_rot)
            if all(torch.equal(a, b) for a, b in zip(want, got)):
                module.expand_kv = expand_kv
                self.patched_kv.append(module)

    @staticmethod
    def _interleaved(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)

        def rotate(x):
            return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)

        return (q * cos) + (rotate(q) * sin), (k * cos) + (rotate(k) * sin)

    def __enter__(self):
        try:
            self._patch()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _patch(self):
        import sys
        for name, module in list(sys.modules.items()):
            original = getattr(module, "apply_rotary_pos_emb_interleave", None) if name in self.READ_BY_SCORES else None
            if not callable(original):
                continue
            g = torch.Generator().manual_seed(0)
            q, k = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64), torch.randn(2, 1, 5, 8, generator=g,
                                                                                           dtype=torch.float64)
            angles = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
            angles = torch.cat([angles, angles], dim=-1)
            want = original(q, k, angles.cos(), angles.sin())
            got = self._interleaved(q, k, angles.cos(), angles.sin())
            gather = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])
            if all(torch.allclose(w, g_[..., gather], rtol=0, atol=1e-12) for w, g_ in zip(want, got)):
                module.apply_rotary_pos_emb_interleave = self._interleaved
                self.patched.append((module, original))
        self._patch_expand_kv()

    def __exit__(self, *exc):
        for module, original in self.patched:
            module.apply_rotary_pos_emb_interleave = original
        for module in self.patched_kv:
            del module.expand_kv
        return False


class _LongRopeByLength:
    """While exporting: transformers' longrope (Phi-3's rotary) takes its long factors when the
    sequence is longer than the config's original_max_position_embeddings L, by a Python `if` on
    max(position_ids) + 1, which torch.export cannot trace (a data-dependent branch). Each such
    rotary module instead takes w = min(max(S - L, 0), 1) of the sequence length S and the
    frequencies short (1 - w) + long w (exactly one table: w is 0 or 1), arithmetic on the length
    that the program keeps and autosp evaluates at the length it trains. Where positions are
    0..S - 1, as in the program, max(position_ids) + 1 is S."""

    def __init__(self, model):
        self.model = model
        self.patched = []

    def __enter__(self):
        # (torch warns of the table assigned to the module while exporting, which is the point)
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        warnings.filterwarnings("ignore", message=r"The tensor attribute .*inv_freq was assigned during export")
        for module in self.model.modules():
            if getattr(module, "rope_type", None) != "longrope" or "inv_freq" not in module._buffers:
                continue
            config = module.config
            L = getattr(config, "original_max_position_embeddings", None) or config.max_position_embeddings
            short = module.original_inv_freq
            long, _ = module.rope_init_fn(config, short.device, seq_len=L + 1)
            buffer = module._buffers.pop("inv_freq")
            forward = module.forward

            def by_length(x, position_ids, module=module, forward=forward, short=short, long=long, L=L):
                w = torch.sym_min(torch.sym_max(position_ids.shape[-1] - L, 0), 1)
                module.__dict__["inv_freq"] = short * (1 - w) + long * w
                return forward(x, position_ids)

            module.forward = by_length
            module.rope_type = "longrope (by length)"  # transformers' own update skips it
            self.patched.append((module, buffer))
        return self

    def __exit__(self, *exc):
        for module, buffer in self.patched:
            del module.forward
            module.__dict__.pop("inv_freq", None)
            module._buffers["inv_freq"] = buffer
            module.rope_type = "longrope"
        self.warnings.__exit__(*exc)
        return False


class _BatchFirstSelfAttention:
    """While exporting: torch.nn.MultiheadAttention (nn.TransformerEncoderLayer's) computes in
    F.multi_head_attention_forward on [S, B, E] with the heads merged into the batch ([B H, S,
    D]), a layout autosp's importer does not take apart. For the export, a module used as
    batch-first self-attention (query is key is value, one in_proj for q, k and v, no bias_k or
    bias_v, no zero attention, no key_padding_mask, no weights asked for, no dropout while
    training, a 2-D attn_mask or is_causal) computes the same thing in the layout transformers'
    models use: the in_proj linear split in three, [B, H, S, D], scaled_dot_product_attention,
    and out_proj. is_causal is PyTorch's hint that the mask is the causal one, taken as
    multi_head_attention_forward takes it there (SDPA's is_causal, the mask unused); a mask
    alone is passed on (as the additive mask PyTorch makes of it). Any other call runs the
    module's own forward. And nn.TransformerEncoder's guess whether a mask is the causal one
    (_detect_is_causal_mask: torch.equal with one it makes, which torch.export cannot trace)
    answers only what it was told (is_causal, else no): the mask itself is passed on, and autosp
    checks it entry by entry."""

    def __enter__(self):
        import torch.nn.modules.transformer as transformer
        self.detect = transformer._detect_is_causal_mask
        transformer._detect_is_causal_mask = lambda mask, is_causal=None, size=None: bool(is_causal)
        self.forward = torch.nn.MultiheadAttention.forward
        original = self.forward

        def forward(mha, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                    average_attn_weights=True, is_causal=False):
            if not (mha.batch_first and query is key and key is value and query.dim() == 3
                    and mha._qkv_same_embed_dim and mha.bias_k is None and mha.bias_v is None
                    and not mha.add_zero_attn and key_padding_mask is None and not need_weights
                    and (mha.dropout == 0.0 or not mha.training)
                    and (is_causal or (attn_mask is not None and attn_mask.dim() == 2))):
                return original(mha, query, key, value, key_padding_mask, need_weights, attn_mask,
                                average_attn_weights, is_causal)
            B, S, E = query.shape
            H = mha.num_heads
            q, k, v = (t.view(B, S, H, E // H).transpose(1, 2)
                       for t in torch.nn.functional.linear(query, mha.in_proj_weight, mha.in_proj_bias).chunk(3, -1))
            if is_causal:
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                mask = torch.nn.functional._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None,
                                                           other_name="", target_type=query.dtype,
                                                           check_other=False)
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            out = torch.nn.functional.linear(out.transpose(1, 2).reshape(B, S, E), mha.out_proj.weight,
                                             mha.out_proj.bias)
            return out, None

        torch.nn.MultiheadAttention.forward = forward
        return self

    def __exit__(self, *exc):
        import torch.nn.modules.transformer as transformer
        transformer._detect_is_causal_mask = self.detect
        torch.nn.MultiheadAttention.forward = self.forward
        return False


def _in_float32(module, always_copy=False):
    """The module itself where all its floating tensors are fp32 (and no copy is asked for), else
    an fp32 copy of it."""
    tensors = list(module.parameters()) + list(module.buffers())
    if not always_copy and all(t.dtype == torch.float32 for t in tensors if t.is_floating_point()):
        return module
    import copy
    return copy.deepcopy(module).float()


class _SparseMoeBlocks:
    """While exporting: transformers' sparse mixture-of-experts blocks (Mixtral's, Qwen3-MoE's,
    OLMoE's) send each token to its top-k experts through a loop over the experts hit (nonzero,
    where, index_add_), which torch.export cannot trace with a dynamic sequence. A block made of a
    router `gate` (a linear without bias of E outputs), `experts` (E SwiGLU MLPs: gate_proj, up_proj,
    down_proj or Mixtral's w1, w3, w2, linears without bias) and `top_k` computes, for the export,
    its router logits with its own gate and the rest as one `autosp::moe` node of the experts'
    weights (autosp's moe op), plus, where the block has one (Qwen2-MoE), its shared expert times
    the sigmoid of its shared_expert_gate. Before that, the rewrite is run against the block's own
    forward on a sample, with the chosen weights normalised to sum 1 and without: the form that gives the
    block's output is kept, and a block that neither gives (another routing or activation) is
    refused, named. Mixtral's router jitter (random) is refused above 0.
    transformers 5's blocks keep their experts stacked (gate_up_proj [E, 2 I, H], down_proj
    [E, H, I]) behind a router module: the block's forward is kept as written, its router's
    logits taken as it returns them, and its experts are one `autosp::moe_stacked` node, with the
    routing the check finds among the moe op's (_patch_stacked). gpt-oss's block (_patch_gpt_oss)
    and DBRX's (_patch_dbrx) keep their experts as those models do, read by `autosp::moe_gpt_oss`
    and `autosp::moe_apart`."""

    def __init__(self, model):
        self.model = model
        self.patched = []      # modules whose forward is patched
        self.patched_moe = []  # blocks whose moe method is

    @staticmethod
    def _layer_names(module):
        """The name of the block's router linear (its `gate`, or the one linear a `gate` module
        holds and nothing else: HunYuan-MoE's `gate.wg`) and the experts' gate, up and down
        layers' names (all experts alike), or None: not such a block."""
        gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
        k = getattr(module, "top_k", None)
        router = "gate"
        if isinstance(gate, torch.nn.Module) and not isinstance(gate, torch.nn.Linear):
            children = list(gate.named_children())
            if len(children) != 1 or not isinstance(children[0][1], torch.nn.Linear) or len(list(gate.buffers())) or \
                    len(list(gate.parameters())) != len(list(children[0][1].parameters())):
                return None
            router, gate = f"gate.{children[0][0]}", children[0][1]
        if not (isinstance(gate, torch.nn.Linear) and gate.bias is None and isinstance(experts, torch.nn.ModuleList)
                and isinstance(k, int) and len(experts) == gate.out_features and 1 <= k <= len(experts)):
            return None
        for names in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")):
            if all(isinstance(getattr(e, n, None), torch.nn.Linear) and getattr(e, n).bias is None
                   for e in experts for n in names):
                return router, names
        return None

    def __enter__(self):
        try:
            self._patch()
        except BaseException:
            self.__exit__()
            raise
        return self

    # transformers 5's experts module (use_experts_implementation) keeps its layout in these; the
    # values autosp's moe op reads.
    _STACKED_LAYOUT = {"is_transposed": False, "is_concatenated": True, "has_bias": False, "has_gate": True,
                       "has_post_expert_norm": False}

    @staticmethod
    def _stacked_parts(module):
        """transformers 5's block: its router (`gate` or `router`, a module with a weight [E, H]
        whose first output is the router logits) and its experts (one module with the stacked
        gate_up_proj [E, 2 I, H] and down_proj [E, H, I], or is_transposed: [E, H, 2 I] and
        [E, I, H]), and top_k; or None."""
        experts = getattr(module, "experts", None)
        router = getattr(module, "gate", None)
        if not isinstance(router, torch.nn.Module):
            router = getattr(module, "router", None)
        if not isinstance(experts, torch.nn.Module) or not isinstance(router, torch.nn.Module):
            return None
        gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
        # the router's weight: its own, or its one linear's (HunYuan-MoE's wg)
        weight = getattr(router, "weight", None)
        if not isinstance(weight, torch.nn.Parameter):
            linears = [m for m in router.children() if isinstance(m, torch.nn.Linear) and m.bias is None]
            weight = linears[0].weight if len(linears) == 1 else None
        if not all(isinstance(p, torch.nn.Parameter) for p in (gate_up, down, weight)):
            return None
        if gate_up.dim() != 3 or down.dim() != 3 or weight.dim() != 2:
            return None
        E, I2, H = gate_up.shape
        if getattr(experts, "is_transposed", False) is True:  # Aria's: gate_up_proj [E, H, 2 I]
            E, H, I2 = gate_up.shape
        k = getattr(router, "top_k", None) or getattr(module, "top_k", None)
        if tuple(weight.shape) != (E, H) or not isinstance(k, int) or not 1 <= k <= E:
            return None
        return router, experts, k, weight

    @staticmethod
    def _router_weight(router):
        """A router module's weight [E, H]: its own, or its one linear's without bias (LongCat-Flash's
        classifier); None without either."""
        weight = getattr(router, "weight", None)
        if weight is None:
            linears = [m for m in router.children() if isinstance(m, torch.nn.Linear) and m.bias is None]
            weight = linears[0].weight if len(linears) == 1 else None
        return weight

    @classmethod
    def _listed_router_parts(cls, module):
        """transformers 4's block of a router module (not a linear: GLM-4.5's, DeepSeek-V3's, its
        `gate`; LongCat-Flash's, its `router`) with a weight [E, H] (its own, or its one linear's:
        LongCat-Flash's classifier), a list of E SwiGLU experts, the last Z of them maybe identities
        (LongCat-Flash's zero-computation experts), and a `moe` method: (router, the experts' layer
        names, top_k, the weight, Z), or None."""
        router, experts = getattr(module, "gate", None), getattr(module, "experts", None)
        if not isinstance(router, torch.nn.Module):
            router = getattr(module, "router", None)
        if isinstance(router, torch.nn.Linear) or not isinstance(router, torch.nn.Module) or \
                not isinstance(experts, torch.nn.ModuleList) or not callable(getattr(module, "moe", None)):
            return None
        weight = cls._router_weight(router)
        if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 2 or weight.shape[0] != len(experts):
            return None
        zero = 0
        while zero < len(experts) - 1 and isinstance(experts[len(experts) - 1 - zero], torch.nn.Identity):
            zero += 1
        k = getattr(router, "top_k", None) or getattr(module, "top_k", None)
        if not isinstance(k, int) or not 1 <= k <= len(experts):
            return None
        for names in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")):
            if all(isinstance(getattr(e, n, None), torch.nn.Linear) and getattr(e, n).bias is None
                   for e in experts[:len(experts) - zero] for n in names):
                return router, names, k, weight, zero
        return None

    @staticmethod
    def _router_bias(where, router, weight, E):
        """A router's score correction bias [E] (DeepSeek-V3's, GLM-4.5's, Ernie 4.5's [1, E]), which
        its choice adds to the scores: (its name in the router, the tensor), or None; any other
        state beside its weight is another router, refused."""
        extra = [(n, t) for n, t in list(router.named_parameters()) + list(router.named_buffers()) if t is not weight]
        if not extra:
            return None
        if len(extra) == 1 and extra[0][0].endswith("bias") and extra[0][1].numel() == E:
            return extra[0]
        raise ValueError(f"autosp export: {where}'s router ({type(router).__name__}) holds "
                         f"{', '.join(n for n, _ in extra)} beside its weight, not one correction bias of its "
                         f"{E} experts: another routing than autosp's moe op's; not supported yet")

    @staticmethod
    def _routing_candidates(router):
        """The routings a router may compute (a check keeps the first that gives the block's
        output): its scores softmax or sigmoid, normalised or not, and where it has groups
        (n_group, topk_group), each group scored by its best or its two best, the other groups'
        experts -inf or 0 for the choice (DeepSeek-V2's only with its topk_method
        "group_limited_greedy"); its routed_scaling_factor."""
        groups = int(getattr(router, "n_group", None) or getattr(router, "num_group", None) or 1)
        if getattr(router, "topk_method", None) == "greedy":  # DeepSeek-V2-Lite's: its groups unused
            groups = 1
        topk_group = int(getattr(router, "topk_group", None) or groups)
        scale = float(getattr(router, "routed_scaling_factor", None) or 1.0)
        candidates = []
        for score in ("softmax", "sigmoid"):
            for normalize in (True, False):
                for group_score in (("top2", "max") if groups > 1 else ("max",)):
                    for dropped in (("-inf", "zero") if groups > 1 else ("-inf",)):
                        candidates.append(dict(normalize=normalize, score=score, groups=groups, topk_group=topk_group,
                                               group_score=group_score, dropped=dropped, scale=scale,
                                               norm_eps=1e-20 if score == "sigmoid" and normalize else 0.0))
        return candidates

    @staticmethod
    def _routing_kwargs(routing, bias_values):
        """The moe op's routing arguments of a candidate (none for a plain router: the archives of
        plain routers stay as they were) and the bias values."""
        r = dict(routing)
        r.pop("normalize")
        if bias_values is not None:
            r["bias"] = bias_values
        elif r["score"] == "softmax" and r["groups"] == 1 and r["scale"] == 1.0:
            r = {}
        return r

    @staticmethod
    def _random_bias(holder, name):
        """The checked copy's correction bias `name` in `holder`, drawn at random: at 0 a sample
        would not show the choice's use of it."""
        bias = dict(list(holder.named_parameters()) + list(holder.named_buffers()))[name]
        with torch.no_grad():
            bias.copy_(0.1 * torch.randn(bias.shape, generator=torch.Generator().manual_seed(1)))
        return bias

    @staticmethod
    def _first_fit(want, candidates, run):
        """The first routing r of the candidates whose run(r) gives the block's own output `want`
        (either may be a tuple whose first item is the output), or None."""
        want = want[0] if isinstance(want, tuple) else want
        for routing in candidates:
            got = run(routing)
            got = got[0] if isinstance(got, tuple) else got
            if torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max())):
                return routing
        return None

    @classmethod
    def _routing_of(cls, probe, width, device, candidates, state, rewrite):
        """The check of a block whose router or experts are rewritten in place: the block's own
        output on 64 fp32 sample tokens, then the first candidate routing (state["routing"])
        whose rewrite, installed on the probe by rewrite(), gives it; or None."""
        sample = torch.randn(1, 64, width, generator=torch.Generator().manual_seed(0), dtype=torch.float32,
                             device=device)

        def run(routing):
            state["routing"] = routing
            return probe(sample)

        with torch.no_grad():
            want = probe(sample)
            rewrite()
            return cls._first_fit(want, candidates, run)

    @staticmethod
    def _parallel_experts_parts(module):
        """transformers 4's GraniteMoE block: a `router` module of one linear `layer` [E, H]
        without bias and a `top_k`, and the experts stacked as two parallel layers, `input_linear`
        [E, 2 I, H] (each expert's gate rows, then its up rows) and `output_linear` [E, H, I]:
        (the router's linear, top_k), or None."""
        router = getattr(module, "router", None)
        linear, k = getattr(router, "layer", None), getattr(router, "top_k", None)
        w_in = getattr(getattr(module, "input_linear", None), "weight", None)
        w_out = getattr(getattr(module, "output_linear", None), "weight", None)
        if not (isinstance(linear, torch.nn.Linear) and linear.bias is None and isinstance(k, int) and
                isinstance(w_in, torch.nn.Parameter) and isinstance(w_out, torch.nn.Parameter) and
                w_in.dim() == 3 and w_out.dim() == 3):
            return None
        E, H = linear.out_features, linear.in_features
        I = w_out.shape[2]
        if w_in.shape != (E, 2 * I, H) or w_out.shape != (E, H, I) or not 1 <= k <= E or \
                len(list(module.parameters())) != 3 or len(list(module.buffers())):
            return None
        return linear, k

    def _patch_parallel_experts(self, name, module, linear, k):
        """A GraniteMoE block (transformers 4; _parallel_experts_parts): its forward is its router's
        logits and one autosp::moe_stacked of its two parallel layers, with the routing the check
        finds (its softmax of the top k logits: the normalised softmax top k)."""
        where = f"{name} ({type(module).__name__})"
        candidates = self._routing_candidates(module.router)

        def moe(layer_input, routing, module=module):
            x = layer_input.reshape(-1, layer_input.shape[-1])
            logits = module.router.layer(x)
            out = torch.ops.autosp.moe_stacked(x, logits, module.input_linear.weight, module.output_linear.weight, k,
                                               routing["normalize"], **self._routing_kwargs(routing, None))
            return out.view(layer_input.shape), logits

        probe = _in_float32(module)
        sample = torch.randn(1, 8, linear.in_features, generator=torch.Generator().manual_seed(0),
                             dtype=torch.float32, device=linear.weight.device)
        with torch.no_grad():
            want = probe(sample)
            tuple_out = isinstance(want, tuple)
            fit = self._first_fit(want, candidates, lambda r: moe(sample, r, module=probe))
        if fit is None:
            raise ValueError(f"autosp export: {where} has a router and parallel experts, but computes something "
                             f"else than top-k routing over SwiGLU experts that autosp's moe op computes, e.g. "
                             f"another routing or activation; not supported yet")

        def forward(layer_input, moe=moe, routing=fit, tuple_out=tuple_out):
            out, logits = moe(layer_input, routing)
            return (out, logits) if tuple_out else out

        module.forward = forward
        self.patched.append(module)

    def _patch_listed_router(self, name, module, router, names, k, weight, zero):
        """transformers 4's blocks of a router module (GLM-4.5's, DeepSeek-V3's: its weight [E, H],
        maybe a correction bias) and a list of experts, whose `moe(hidden_states, topk_indices,
        topk_weights)` loops over the experts hit: that method is one autosp::moe of the router's
        logits (its weight's product with the rows) and the experts' weights, with the routing the
        check finds; the block's forward (its shared experts) runs as written."""
        where = f"{name} ({type(module).__name__})"
        E = len(module.experts)
        found = self._router_bias(where, router, weight, E)
        router_name = "gate" if getattr(module, "gate", None) is router else "router"
        candidates = self._routing_candidates(router)
        state = {"routing": candidates[0]}

        def rewrite(block, router, bias):
            values = None if bias is None else [float(b) for b in bias.detach().reshape(-1).double()]

            def moe(hidden_states, topk_indices=None, topk_weights=None):
                # (the weights read through the modules while tracing: torch.export then sees parameters)
                r = state["routing"]
                logits = torch.nn.functional.linear(hidden_states, self._router_weight(router))
                computed = block.experts[:len(block.experts) - zero]
                gate, up, down = ([getattr(e, n).weight for e in computed] for n in names)
                return torch.ops.autosp.moe(hidden_states, logits, gate, up, down, k, r["normalize"],
                                            **self._routing_kwargs(r, values),
                                            **({"zero_experts": zero} if zero else {}))

            block.moe = moe

        probe = _in_float32(module, always_copy=found is not None)
        probe_router = getattr(probe, router_name)
        probe_bias = None if found is None else self._random_bias(probe_router, found[0])
        fit = None
        try:
            fit = self._routing_of(probe, weight.shape[1], weight.device, candidates, state,
                                   lambda: rewrite(probe, probe_router, probe_bias))
        finally:
            if probe is module:
                del module.moe
        if fit is None:
            raise ValueError(f"autosp export: {where} has a router and experts, but computes something else than "
                             f"top-k routing over SwiGLU experts that autosp's moe op computes (softmax or sigmoid "
                             f"scores, groups, a correction bias), e.g. another routing or activation; not "
                             f"supported yet")
        state["routing"] = fit
        rewrite(module, router, None if found is None else found[1])
        self.patched_moe.append(module)

    def _patch_stacked(self, name, module, router, experts, k, weight):
        where = f"{name} ({type(module).__name__})"
        layout = {key: getattr(experts, key, want) for key, want in self._STACKED_LAYOUT.items()}
        # transposed (Aria's): gate_up_proj [E, H, 2 I] (the gate's columns, then the up's), down_proj [E, I, H]
        transposed = layout["is_transposed"] is True
        gate_up, down = experts.gate_up_proj.shape, experts.down_proj.shape
        inner, outer = (1, 2) if transposed else (2, 1)
        if dict(layout, is_transposed=False) != self._STACKED_LAYOUT or gate_up[outer] != 2 * down[inner] or \
                down[outer] != gate_up[inner]:
            raise ValueError(f"autosp export: {where} keeps its experts otherwise than autosp's moe op takes them "
                             f"(gate_up_proj [E, 2 I, H], each expert's gate rows then its up rows, down_proj "
                             f"[E, H, I], or both transposed; no biases, no norm after the experts): {layout}, "
                             f"gate_up_proj {list(gate_up)}, down_proj {list(down)}; not supported yet")
        if getattr(module, "jitter_noise", 0) and module.training:
            raise ValueError(f"autosp export: {where} multiplies its input by random noise (router_jitter_noise="
                             f"{module.jitter_noise}); set it to 0 to train with autosp")
        found = self._router_bias(where, router, weight, experts.gate_up_proj.shape[0])
        bias = None if found is None else found[1]
        candidates = self._routing_candidates(router)

        # The block's own forward runs as written (a shared expert included); its router's logits
        # are kept as it returns them, and its experts are one autosp::moe_stacked of them.
        state = {"routing": candidates[0]}

        def rewrite(router, experts, bias):
            routed, router_forward = {}, router.forward
            # (its values read now, as the program's constants: under the export they are symbolic)
            values = None if bias is None else [float(b) for b in bias.detach().reshape(-1).double()]

            def router_kept(*args, **kwargs):
                out = router_forward(*args, **kwargs)
                routed["logits"] = out[0] if isinstance(out, tuple) else out
                return out

            def experts_forward(hidden_states, *args, **kwargs):
                logits = routed.pop("logits", None)
                if logits is None:
                    raise ValueError(f"autosp export: {where}'s experts ran before its router")
                r = state["routing"]
                return torch.ops.autosp.moe_stacked(hidden_states, logits.reshape(-1, logits.shape[-1]),
                                                    experts.gate_up_proj, experts.down_proj, k, r["normalize"],
                                                    **self._routing_kwargs(r, values),
                                                    **({"transposed": True} if transposed else {}))

            router.forward, experts.forward = router_kept, experts_forward

        # The check, in fp32 (a bf16 block's own roundings are not the routing's), on 64 tokens,
        # with the correction bias, if any, drawn at random in the copy checked (at 0 it would not
        # show the choice's use of it).
        probe = _in_float32(module, always_copy=bias is not None)
        probe_router, probe_experts = self._stacked_parts(probe)[:2]
        probe_bias = None if bias is None else self._random_bias(probe_router, found[0])
        fit = None
        try:
            fit = self._routing_of(probe, weight.shape[1], weight.device, candidates, state,
                                   lambda: rewrite(probe_router, probe_experts, probe_bias))
        finally:
            if probe is module:
                del router.forward, experts.forward
        if fit is None:
            raise ValueError(f"autosp export: {where} has a router and experts, but computes something else than "
                             f"top-k routing over SwiGLU experts that autosp's moe op computes (softmax or sigmoid "
                             f"scores, groups, a correction bias), e.g. another routing or activation; not "
                             f"supported yet")
        state["routing"] = fit
        rewrite(router, experts, bias)
        self.patched += [router, experts]

    def _install_checked(self, where, module, forward, width, device, computes):
        """Installs forward(hidden_states, module=...) as the block's forward, after checking it
        against the block's own on a sample (fp32, 64 tokens of `width`; of a tuple, its first
        output); a block it does not match is refused: "{where} has `computes`"."""
        probe = _in_float32(module)
        sample = torch.randn(1, 64, width, generator=torch.Generator().manual_seed(0), dtype=torch.float32,
                             device=device)
        with torch.no_grad():
            want, got = (y[0] if isinstance(y, tuple) else y for y in (probe(sample), forward(sample, module=probe)))
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max())):
                raise ValueError(f"autosp export: {where} has {computes}; not supported yet")
        module.forward = forward
        self.patched.append(module)

    @staticmethod
    def _gpt_oss_parts(module):
        """gpt-oss's block (transformers' GptOssMLP): a `router` of weight [E, H], bias [E] and top_k,
        and `experts` of gate_up_proj [E, H, 2 I] (gate and up columns interleaved), down_proj
        [E, I, H], their biases and the GLU's alpha and limit: (router, experts), or None."""
        router, experts = getattr(module, "router", None), getattr(module, "experts", None)
        if not isinstance(router, torch.nn.Module) or not isinstance(experts, torch.nn.Module):
            return None
        names = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
        w = [getattr(experts, n, None) for n in names]
        weight, bias, k = getattr(router, "weight", None), getattr(router, "bias", None), getattr(router, "top_k", None)
        if not all(isinstance(p, torch.nn.Parameter) for p in w + [weight, bias]) or not isinstance(k, int) or \
                not isinstance(getattr(experts, "alpha", None), float) or \
                not isinstance(getattr(experts, "limit", None), float):
            return None
        E, H = weight.shape if weight.dim() == 2 else (0, 0)
        I = w[2].shape[1] if w[2].dim() == 3 else 0
        if I < 1 or tuple(w[0].shape) != (E, H, 2 * I) or tuple(w[1].shape) != (E, 2 * I) or \
                tuple(w[2].shape) != (E, I, H) or tuple(w[3].shape) != (E, H) or tuple(bias.shape) != (E,) or \
                not 1 <= k <= E:
            return None
        return router, experts

    def _patch_gpt_oss(self, name, module, router, experts):
        """A gpt-oss block (_gpt_oss_parts): its router's logits (a linear with bias) and one
        autosp::moe_gpt_oss of its experts, checked against the block's own forward on a sample
        (its softmax of the top k logits is the normalised softmax top k)."""
        where = f"{name} ({type(module).__name__})"
        if getattr(getattr(self.model, "config", None), "output_router_logits", False):
            raise ValueError(f"autosp export: {where}: gpt-oss's load-balancing loss takes the softmax of its router's "
                             f"scattered top-k probabilities (not of its logits), which autosp's moe_balance does not "
                             f"compute; set output_router_logits=False")

        def forward(hidden_states, module=module):
            r, x_ = module.router, module.experts
            x = hidden_states.reshape(-1, hidden_states.shape[-1])
            logits = torch.nn.functional.linear(x, r.weight, r.bias)
            out = torch.ops.autosp.moe_gpt_oss(x, logits, x_.gate_up_proj, x_.gate_up_proj_bias, x_.down_proj,
                                               x_.down_proj_bias, r.top_k, float(x_.alpha), float(x_.limit))
            return out.view(hidden_states.shape), logits

        self._install_checked(where, module, forward, router.weight.shape[1], router.weight.device,
                              "gpt-oss's router and experts, but computes something else than autosp's moe op of "
                              "gpt-oss's experts (softmax of the top-k logits, the clamped GLU)")

    @staticmethod
    def _llama4_parts(module):
        """Llama 4's block (transformers' Llama4TextMoe): a `router` linear [E, H] without bias and its
        top_k, `experts` of gate_up_proj [E, H, 2 I] (the gate's columns, then the up's) and
        down_proj [E, I, H], and a `shared_expert`: (router, experts), or None."""
        router, experts = getattr(module, "router", None), getattr(module, "experts", None)
        if type(module).__name__ != "Llama4TextMoe" or not isinstance(router, torch.nn.Linear) or \
                router.bias is not None or not isinstance(getattr(module, "shared_expert", None), torch.nn.Module):
            return None
        gate_up, down, k = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None), \
            getattr(router, "top_k", None)
        if not isinstance(gate_up, torch.nn.Parameter) or not isinstance(down, torch.nn.Parameter) or \
                not isinstance(k, int):
            return None
        E, H = router.weight.shape
        I = down.shape[1] if down.dim() == 3 else 0
        if I < 1 or tuple(gate_up.shape) != (E, H, 2 * I) or tuple(down.shape) != (E, I, H) or not 1 <= k <= E:
            return None
        return router, experts

    def _patch_llama4(self, name, module, router, experts):
        """A Llama 4 block (_llama4_parts): its router's logits, one autosp::moe_llama4 of its experts
        (the sigmoid of each chosen logit weighting the expert's input) and its shared expert, checked
        against the block's own forward on a sample."""
        where = f"{name} ({type(module).__name__})"

        def forward(hidden_states, module=module):
            x = hidden_states.reshape(-1, hidden_states.shape[-1])
            logits = torch.nn.functional.linear(x, module.router.weight)
            routed = torch.ops.autosp.moe_llama4(x, logits, module.experts.gate_up_proj, module.experts.down_proj,
                                                 module.router.top_k)
            return module.shared_expert(x) + routed, logits

        self._install_checked(where, module, forward, router.weight.shape[1], router.weight.device,
                              "Llama 4's router and experts, but computes something else than autosp's moe op of "
                              "Llama 4's experts (the sigmoid of the top-k logits weighting each expert's input, "
                              "SwiGLU)")

    @staticmethod
    def _aria_parts(module):
        """Aria's block in transformers 4 (AriaTextMoELayer: a grouped gemm over tokens sorted by
        expert): a `router` linear [E, H] without bias, `experts` of fc1 [E, H, 2 I] (the gate's
        columns, then the up's) and fc2 [E, I, H], `shared_experts`, and its config's moe_topk:
        (router, experts, k), or None."""
        router, experts = getattr(module, "router", None), getattr(module, "experts", None)
        if type(module).__name__ != "AriaTextMoELayer" or not isinstance(router, torch.nn.Linear) or \
                router.bias is not None or not isinstance(getattr(module, "shared_experts", None), torch.nn.Module):
            return None
        fc1, fc2 = getattr(getattr(experts, "fc1", None), "weight", None), \
            getattr(getattr(experts, "fc2", None), "weight", None)
        k = getattr(getattr(module, "config", None), "moe_topk", None)
        if not isinstance(fc1, torch.nn.Parameter) or not isinstance(fc2, torch.nn.Parameter) or not isinstance(k, int):
            return None
        E, H = router.weight.shape
        I = fc2.shape[1] if fc2.dim() == 3 else 0
        if I < 1 or tuple(fc1.shape) != (E, H, 2 * I) or tuple(fc2.shape) != (E, I, H) or not 1 <= k <= E:
            return None
        return router, experts, k

    def _patch_aria(self, name, module, router, experts, k):
        """An Aria block (_aria_parts): its router's logits, one autosp::moe_stacked of its experts in
        their transposed layout (the softmax of the top-k logits: the normalised softmax top k) and
        its shared experts, checked against the block's own forward on a sample."""
        where = f"{name} ({type(module).__name__})"

        def forward(hidden_states, module=module):
            x = hidden_states.reshape(-1, hidden_states.shape[-1])
            logits = torch.nn.functional.linear(x, module.router.weight)
            routed = torch.ops.autosp.moe_stacked(x, logits, module.experts.fc1.weight, module.experts.fc2.weight, k,
                                                  True, transposed=True)
            return routed.view(hidden_states.shape) + module.shared_experts(hidden_states)

        self._install_checked(where, module, forward, router.weight.shape[1], router.weight.device,
                              "Aria's router and experts, but computes something else than autosp's moe op of them "
                              "(the softmax of the top-k logits, SwiGLU)")

    @staticmethod
    def _longcat_parts(module):
        """LongCat-Flash's block in transformers 5 (LongcatFlashMoE: its zero-computation experts
        handled around the experts' call): a `router` of one `classifier` linear [E + Z, H] without
        bias, a correction bias, top_k and routed_scaling_factor; `experts` stacked (gate_up_proj
        [E, 2 I, H], down_proj [E, H, I]); zero_expert_num Z: (router, experts, Z), or None."""
        router, experts = getattr(module, "router", None), getattr(module, "experts", None)
        zero = getattr(module, "zero_expert_num", None)
        if type(module).__name__ != "LongcatFlashMoE" or not isinstance(zero, int) or \
                not isinstance(getattr(router, "classifier", None), torch.nn.Linear) or \
                router.classifier.bias is not None:
            return None
        gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
        if not isinstance(gate_up, torch.nn.Parameter) or not isinstance(down, torch.nn.Parameter) or \
                gate_up.dim() != 3 or down.dim() != 3 or getattr(experts, "is_transposed", False):
            return None
        E, I2, H = gate_up.shape
        if tuple(down.shape) != (E, H, I2 // 2) or tuple(router.classifier.weight.shape) != (E + zero, H) or \
                not isinstance(getattr(router, "top_k", None), int):
            return None
        return router, experts, zero

    def _patch_longcat(self, name, module, router, experts, zero):
        """A LongCat-Flash block (_longcat_parts): its router's logits and one autosp::moe_stacked of
        its experts with its zero-computation experts: the softmax over all of them, chosen by the
        scores plus the correction bias, weighted unnormalised times routed_scaling_factor. Checked
        against the block's own forward on a sample, in a copy whose bias is drawn at random."""
        where = f"{name} ({type(module).__name__})"
        found = self._router_bias(where, router, router.classifier.weight, router.classifier.weight.shape[0])
        if found is None:
            raise ValueError(f"autosp export: {where}'s router has no correction bias; not supported yet")
        k, scale = router.top_k, float(router.routed_scaling_factor)

        def block_forward(values):
            def forward(hidden_states, module=module):
                x = hidden_states.reshape(-1, hidden_states.shape[-1])
                logits = torch.nn.functional.linear(x, module.router.classifier.weight)
                out = torch.ops.autosp.moe_stacked(x, logits, module.experts.gate_up_proj, module.experts.down_proj, k,
                                                   False, scale=scale, bias=values, zero_experts=zero)
                return out.reshape(hidden_states.shape)
            return forward

        def values_of(bias):  # (read before the trace: the op's attribute)
            return [float(b) for b in bias.detach().reshape(-1).double()]

        probe = _in_float32(module, always_copy=True)
        probe_values = values_of(self._random_bias(probe.router, found[0]))
        sample = torch.randn(1, 64, router.classifier.weight.shape[1], generator=torch.Generator().manual_seed(0),
                             dtype=torch.float32, device=router.classifier.weight.device)
        with torch.no_grad():
            want, got = probe(sample), block_forward(probe_values)(sample, module=probe)
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max())):
                raise ValueError(f"autosp export: {where} has LongCat-Flash's router and experts, but computes "
                                 f"something else than autosp's moe op of them (the softmax over every expert, the "
                                 f"choice by it plus the correction bias, identities for the zero experts); not "
                                 f"supported yet")
        module.forward = block_forward(values_of(found[1]))
        self.patched.append(module)

    @staticmethod
    def _dbrx_parts(module):
        """DBRX's block (transformers' DbrxFFN): a `router` of one linear `layer` [E, H] without
        bias and moe_jitter_eps, its top k and moe_normalize_expert_weights (the router's in
        transformers 4, the block's in 5), and `experts.mlp` of w1, v1 and w2 [E I, H] (each
        expert's gate, up and transposed down) with its activation: (router, mlp), or None."""
        router, mlp = getattr(module, "router", None), getattr(getattr(module, "experts", None), "mlp", None)
        layer = getattr(router, "layer", None)
        if not isinstance(layer, torch.nn.Linear) or layer.bias is not None or not isinstance(mlp, torch.nn.Module):
            return None
        w = [getattr(mlp, n, None) for n in ("w1", "v1", "w2")]
        E, H = layer.out_features, layer.in_features
        I = getattr(mlp, "ffn_hidden_size", None)
        k = getattr(router, "moe_top_k", None) or getattr(module, "top_k", None)
        if not hasattr(router, "moe_normalize_expert_weights") and not hasattr(module, "moe_normalize_expert_weights"):
            return None
        if not all(isinstance(p, torch.nn.Parameter) and p.dim() == 2 for p in w) or not isinstance(I, int) or \
                not isinstance(k, int) or not 1 <= k <= E or any(tuple(p.shape) != (E * I, H) for p in w):
            return None
        return router, mlp

    def _patch_dbrx(self, name, module, router, mlp):
        """A DBRX block (_dbrx_parts): its router's logits and one autosp::moe_apart of w1, v1 and
        w2 viewed [E, I, H] (no copy), checked against the block's own forward on a sample. Its
        top-k weights divided by their p-norm: p = 1 is the normalised softmax top k, None none."""
        where = f"{name} ({type(module).__name__})"
        holder = router if hasattr(router, "moe_normalize_expert_weights") else module
        p, k = holder.moe_normalize_expert_weights, getattr(router, "moe_top_k", None) or module.top_k
        if p is not None and float(p) != 1.0:
            raise ValueError(f"autosp export: {where} divides its top-k weights by their {p}-norm; autosp's moe op "
                             f"normalises by their sum (p = 1) or not at all (None); not supported yet")
        if router.moe_jitter_eps and module.training:
            raise ValueError(f"autosp export: {where} multiplies its input by random noise (moe_jitter_eps="
                             f"{router.moe_jitter_eps}); set it to None to train with autosp")
        if getattr(getattr(self.model, "config", None), "output_router_logits", False):
            raise ValueError(f"autosp export: {where}: DBRX's load-balancing loss takes the softmax of its router's "
                             f"probabilities (not of its logits), which autosp's moe_balance does not compute; set "
                             f"output_router_logits=False")
        normalize = p is not None

        def forward(x, module=module, tuple_out=True):
            r, m = module.router, module.experts.mlp
            h = x.reshape(-1, x.shape[-1])
            logits = r.layer(h)
            E, I, H = r.layer.out_features, m.ffn_hidden_size, r.layer.in_features
            out = torch.ops.autosp.moe_apart(h, logits, m.w1.view(E, I, H), m.v1.view(E, I, H), m.w2.view(E, I, H),
                                             k, normalize).view(x.shape)
            # (transformers 4's block returns its router's probabilities beside, which its model drops
            # without output_router_logits, refused above)
            return (out, logits) if tuple_out else out

        probe = _in_float32(module)
        sample = torch.randn(1, 64, router.layer.in_features, generator=torch.Generator().manual_seed(0),
                             dtype=torch.float32, device=router.layer.weight.device)
        with torch.no_grad():
            want = probe(sample)
            tuple_out = isinstance(want, tuple)
            got, want = forward(sample, module=probe, tuple_out=False), want[0] if tuple_out else want
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max())):
                raise ValueError(f"autosp export: {where} has DBRX's router and experts, but computes something else "
                                 f"than top-k routing over SwiGLU experts that autosp's moe op computes (another "
                                 f"activation than silu?); not supported yet")
        module.forward = lambda x, forward=forward, tuple_out=tuple_out: forward(x, tuple_out=tuple_out)
        self.patched.append(module)

    def _patch(self):
        self.unmatched = []  # modules with experts this does not rewrite (named if the export fails)
        # Each block form: (its parts, or None: not this form; its rewrite), the first match taken.
        forms = ((self._llama4_parts, self._patch_llama4), (self._aria_parts, self._patch_aria),
                 (self._longcat_parts, self._patch_longcat), (self._gpt_oss_parts, self._patch_gpt_oss),
                 (self._dbrx_parts, self._patch_dbrx), (self._stacked_parts, self._patch_stacked),
                 (self._listed_router_parts, self._patch_listed_router),
                 (self._parallel_experts_parts, self._patch_parallel_experts))
        for name, module in self.model.named_modules():
            matched = next(((parts, patch) for parts_of, patch in forms
                            if (parts := parts_of(module)) is not None), None)
            if matched is not None:
                matched[1](name, module, *matched[0])
                continue
            parts = self._layer_names(module)
            if parts is None:
                experts = getattr(module, "experts", None)
                if isinstance(experts, torch.nn.Module):
                    if any(isinstance(getattr(experts, p, None), torch.nn.Parameter) and getattr(experts, p).dim() == 3
                           for p in ("gate_up_proj", "up_proj", "down_proj")):
                        # transformers 5's experts traced by their batched path: a program autosp cannot read
                        raise ValueError(f"autosp export: {name} ({type(module).__name__}) has stacked experts but "
                                         f"not a router autosp reads (a `gate` or `router` module whose one weight "
                                         f"[E, H] gives the logits) or not SwiGLU experts of gate_up_proj and "
                                         f"down_proj; not supported yet")
                    self.unmatched.append(f"{name} ({type(module).__name__})")
                continue
            if getattr(module, "jitter_noise", 0) and module.training:
                raise ValueError(f"autosp export: {name} ({type(module).__name__}) multiplies its input by random "
                                 f"noise (router_jitter_noise={module.jitter_noise}); set it to 0 to train with autosp")
            router, names = parts
            gate = module.get_submodule(router)
            where = f"{name} ({type(module).__name__})"
            # Ernie 4.5-MoE's correction bias, which its choice adds to the probabilities, beside the block
            statics = getattr(module, "moe_statics", None)
            found = self._router_bias(where, statics, None, len(module.experts)) \
                if isinstance(statics, torch.nn.Module) else None
            candidates = self._routing_candidates(module)
            # a shared expert: Qwen2-MoE's behind its sigmoid gate, Ernie 4.5-MoE's and HunYuan-MoE's
            # added as it is
            gated = isinstance(getattr(module, "shared_expert", None), torch.nn.Module) and \
                isinstance(getattr(module, "shared_expert_gate", None), torch.nn.Linear)
            plain_shared = next((n for n in ("shared_experts", "shared_mlp")
                                 if isinstance(getattr(module, n, None), torch.nn.Module)), None)

            def values_of(bias):  # (read before the trace: the op's attribute)
                return None if bias is None else [float(b) for b in bias.detach().reshape(-1).double()]

            def moe(hidden_states, routing, values, module=module, router=router, names=names, gated=gated,
                    plain_shared=plain_shared):
                # (the weights read through the modules while tracing: torch.export then sees parameters)
                x = hidden_states.reshape(-1, hidden_states.shape[-1])
                linear = module.get_submodule(router)
                w = linear.weight  # (Ernie 4.5-MoE's and HunYuan-MoE's routers are fp32 in a bf16 model)
                logits = linear(x) if w.dtype == x.dtype else linear(x.to(w.dtype)).to(x.dtype)
                gate, up, down = ([getattr(e, n).weight for e in module.experts] for n in names)
                out = torch.ops.autosp.moe(x, logits, gate, up, down, module.top_k, routing["normalize"],
                                           **self._routing_kwargs(routing, values))
                if gated:
                    out = out + torch.sigmoid(module.shared_expert_gate(x)) * module.shared_expert(x)
                if plain_shared:
                    out = out + getattr(module, plain_shared)(x)
                return out.view(hidden_states.shape), logits

            # (the check in fp32: a bf16 block's own roundings are not the routing's; with a
            # correction bias, in a copy whose bias is drawn at random, so that it shows)
            probe = _in_float32(module, always_copy=found is not None)
            probe_values = None if found is None else values_of(self._random_bias(probe.moe_statics, found[0]))
            sample = torch.randn(1, 8, gate.in_features, generator=torch.Generator().manual_seed(0),
                                 dtype=torch.float32, device=gate.weight.device)
            with torch.no_grad():
                want = probe(sample)
                tuple_out = isinstance(want, tuple)
                fit = self._first_fit(want, candidates, lambda r: moe(sample, r, probe_values, module=probe))
            if fit is None:
                raise ValueError(f"autosp export: {where} has a router gate, experts and top_k, but computes "
                                 f"something else than top-k routing over SwiGLU experts that autosp's moe op "
                                 f"computes (softmax or sigmoid scores, a correction bias), e.g. another routing "
                                 f"or activation; not supported yet")
            routing, values = fit, values_of(None if found is None else found[1])

            def forward(hidden_states, moe=moe, routing=routing, values=values, tuple_out=tuple_out):
                out, logits = moe(hidden_states, routing, values)
                return (out, logits) if tuple_out else out

            module.forward = forward
            self.patched.append(module)

    def __exit__(self, *exc):
        for module in self.patched:
            del module.forward
        for module in self.patched_moe:
            del module.moe
        return False


class _LoadBalancingLoss:
    """While exporting a model whose config has output_router_logits: transformers adds
    router_aux_loss_coef times load_balancing_loss_func of every layer's router logits to the loss
    (Switch Transformer's load-balancing loss). The function, called from the model's own module,
    computes it as one `autosp::moe_balance` node (the same numbers; autosp's moe_balance op, whose
    sums the autosp pass makes whole over a sequence-parallel group). With an attention mask it
    is refused (autosp's samples have none)."""

    def __init__(self, model):
        self.model = model
        self.patched = None

    def __enter__(self):
        if not getattr(getattr(self.model, "config", None), "output_router_logits", False):
            return self
        import sys
        module = sys.modules.get(type(self.model).__module__)
        original = getattr(module, "load_balancing_loss_func", None)
        if original is None:
            raise ValueError(f"autosp export: {type(self.model).__name__} has output_router_logits but its module has "
                             f"no load_balancing_loss_func, the load-balancing loss autosp reads; set it to False")

        def balance(gate_logits, num_experts=None, top_k=2, attention_mask=None):
            if attention_mask is not None:
                raise ValueError("autosp export: a load-balancing loss over an attention mask (autosp's samples "
                                 "have none)")
            if not isinstance(gate_logits, tuple):
                return 0
            return torch.ops.autosp.moe_balance(list(gate_logits), int(num_experts), int(top_k))

        module.load_balancing_loss_func = balance
        self.patched = (module, original)
        return self

    def __exit__(self, *exc):
        if self.patched:
            module, original = self.patched
            module.load_balancing_loss_func = original
        return False


class _NoGradientCheckpointing:
    """While tracing: gradient checkpointing off, restored after. Traced, the reentrant
    torch.utils.checkpoint runs its function under no_grad, which the program would keep (or which
    torch.export itself fails on: a plain model's own checkpoint calls); autosp recomputes
    activations by its own policy (compile.checkpoint), so the program is the plain forward.
    transformers' modules: their `gradient_checkpointing` flags (gradient_checkpointing_enable's)
    off. Any other code: the reentrant CheckpointFunction calls its function directly, however the
    code imported `checkpoint` (the non-reentrant one traces as the plain forward already). Its
    values and gradients are the function's own; only the memory it saves differs. Said once,
    with a warning."""

    def __init__(self, model):
        self.model, self.on, self.said = model, [], False
        self.own_apply = None

    def __enter__(self):
        self.on = [m for m in self.model.modules() if getattr(m, "gradient_checkpointing", False) is True]
        for m in self.on:
            m.gradient_checkpointing = False
        if self.on:
            self._say()
        function = torch.utils.checkpoint.CheckpointFunction
        self.own_apply = vars(function).get("apply")

        def call_directly(run_function, preserve_rng_state, *args):
            self._say()
            return run_function(*args)

        function.apply = staticmethod(call_directly)
        return self

    def _say(self):
        if not self.said:
            self.said = True
            warnings.warn(f"{type(self.model).__name__} has gradient checkpointing on: the export traces the plain "
                          "forward (autosp recomputes activations as compile.checkpoint says)")

    def __exit__(self, *exc):
        for m in self.on:
            m.gradient_checkpointing = True
        function = torch.utils.checkpoint.CheckpointFunction
        if self.own_apply is None:
            del function.apply  # (the inherited autograd.Function.apply again)
        else:
            function.apply = self.own_apply
        return False


class _EveryParameterRequiresGrad:
    """While tracing: every parameter requires grad, so that a tensor computed from parameters
    does too, frozen ones included (the attention function's test of a learned mask). The graph
    is the same either way, and the flags are back before the archive is written: it records
    the user's (requires_grad=False: frozen, which autosp keeps untrained)."""

    def __init__(self, model):
        self.model, self.frozen = model, []

    def __enter__(self):
        self.frozen = [p for p in self.model.parameters() if not p.requires_grad]
        for p in self.frozen:
            p.requires_grad_(True)
        return self

    def __exit__(self, *exc):
        for p in self.frozen:
            p.requires_grad_(False)
        return False


def _position_table_length(model):
    """The length of the model's position tables from its config (None: it names none)."""
    config = getattr(model, "config", None)
    for key in ("max_seq_len", "n_positions", "max_position_embeddings"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 2:
            return value
    return None


def _refuse_training_loop_adapters(model):
    """PEFT's AdaLoRA prunes its ranks from the training loop (the user calls update_and_allocate
    after each step), outside the forward torch.export traces: autosp would train every rank it
    started with for the whole run, which is another method. Refused rather than trained so."""
    peft_config = getattr(model, "peft_config", None)
    if not isinstance(peft_config, dict):
        return
    for name, config in peft_config.items():
        if type(config).__name__ == "AdaLoraConfig":
            raise ValueError(f"autosp export: adapter {name!r} is AdaLoRA, whose rank allocation runs in the training "
                             f"loop (update_and_allocate), not in the forward autosp imports: autosp would train all "
                             f"{config.init_r} initial ranks throughout. Use LoRA (fixed rank) or DoRA instead")


def export(model, path, batch: int = 2, seq_len: int = 16, max_seq_len: int = 1 << 20, vocab_size=None):
    """Exports `model`'s training loss, forward(input_ids, labels) -> loss, to `path` (.pt2)."""
    _refuse_training_loop_adapters(model)
    use_autosp_attention(model)
    model.train()
    vocab = vocab_size or getattr(getattr(model, "config", None), "vocab_size", None)
    if not vocab:
        raise ValueError(f"autosp export: {type(model).__name__} has no config.vocab_size; pass vocab_size= (the "
                         f"sample token ids are drawn below it)")
    # The sample inputs the archive stores: seeded, so the same model exports to the same bytes.
    ids = torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(0))

    def export_between(shortest, longest):
        b = torch.export.Dim("batch", min=1, max=1 << 16)
        s = torch.export.Dim("seq_len", min=shortest, max=longest)
        with _ConcreteIsCausal(), _NoLayerDrop(model), _LongRopeByLength(model), _BatchFirstSelfAttention(), \
                _InterleavedRopeOfLatentAttention(model), _HalfTablesRope(model), _ComplexRope(model), \
                _Llama4Temperature(model), \
                _SparseMoeBlocks(model) as moe, \
                _LoadBalancingLoss(model), _EveryParameterRequiresGrad(model), _NoGradientCheckpointing(model):
            try:
                return torch.export.export(_LossOf(model), (ids, ids.clone()),
                                           dynamic_shapes=({0: b, 1: s}, {0: b, 1: s}))
            except Exception as e:
                if moe.unmatched and "data-dependent" in str(e):
                    raise ValueError(f"autosp export: {moe.unmatched[0]} has experts but is not a block autosp "
                                     f"rewrites (a router `gate` linear without bias, `experts` of gate/up/down or "
                                     f"w1/w3/w2 linears without bias, `top_k`), and torch.export cannot trace its "
                                     f"data-dependent routing: not supported yet") from e
                raise

    # torch.export refuses a range of lengths the model's code guards; two such guards are
    # taken, each once, with a warning; any other is raised.
    shortest, longest, table = 2, max_seq_len, _position_table_length(model)
    while True:
        try:
            program = export_between(shortest, longest)
            break
        except Exception as e:  # torch._dynamo.exc.UserError: constraints violated
            message = str(e)
            if "Constraints violated (seq_len)" not in message:
                raise
            least = re.search(r"seq_len = Dim\('seq_len', min=(\d+)", message)
            if least and shortest < int(least.group(1)) <= 16:
                # A short sequence the code cannot take as the others (e.g. a model's own label
                # shift, logits[:, :-1], one position at S = 2, which broadcasts).
                shortest = int(least.group(1))
                warnings.warn(f"torch.export needs {type(model).__name__}'s sequences at least {shortest} long, "
                              f"so the archive holds lengths from {shortest}")
            elif table is not None and table <= longest:
                longest = table - 1
                warnings.warn(f"{type(model).__name__} cuts its positions from a table of {table} (its config): "
                              f"torch.export refuses the length {table} itself, so the archive holds lengths up "
                              f"to {longest}")
            elif (most := re.search(r"seq_len = Dim\('seq_len',(?: min=\d+,)? max=(\d+)\)", message)) and \
                    shortest <= int(most.group(1)) < longest:
                # A bound the model's own code guards (a plain module's table of positions:
                # assert seq_len <= max_seq_len), which torch.export reads off the guard.
                longest = int(most.group(1))
                warnings.warn(f"{type(model).__name__}'s code takes sequences of at most {longest} tokens (torch.export "
                              f"reads it off a guard), so the archive holds lengths up to {longest}")
            else:
                raise
    # transformers' config.json rides along (the archive's extra/config.json): autosp's
    # checkpoints of the program are then model directories transformers loads.
    # (with the model's class as "architectures", which save_pretrained adds likewise)
    config, extra = getattr(model, "config", None), None
    # (not a PEFT model's, LoRA's: its state dict names its base model's weights
    # base_model.model.<name>, which that config's architecture does not load)
    if hasattr(config, "to_json_string") and not type(model).__module__.startswith("peft"):
        fields = json.loads(config.to_json_string())
        if not fields.get("architectures"):
            fields["architectures"] = [type(model).__name__]
        extra = {"config.json": json.dumps(fields, indent=2, sort_keys=True) + "\n"}
    torch.export.save(program, path, extra_files=extra)
    return program
