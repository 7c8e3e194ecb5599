"""Key/value caches and the policies that choose what they keep, in one package:

* :mod:`.layer` -- the protocol an attention module speaks to one layer's cache (:class:`LayerCache`) and what a
  cache answers (:class:`KVView`);
* :mod:`.cache` -- the plain cache (:class:`LayerKV`, :class:`KVCache` for a whole decoder) and StreamingLLM's
  (:class:`StreamingKV`);
* :mod:`.observe` -- what a policy may read of one call to rank its keys (:class:`Observed`);
* :mod:`.policy` -- what a policy is (:class:`KVPolicy`), the one list of them (:data:`KV_POLICIES`) and the layer
  cache a policy runs in (:class:`PolicyKV`);
* :mod:`.policies` -- the policies, one class each.

The studies of these caches (the head-aware split, needle recall against bytes, attention sinks) are analyses:
:mod:`multihead.interpret.kv`. An attached HF model runs the same layer caches through transformers' cache API
(:mod:`multihead.hf.cache`).

KV cache policies choose which cached keys each key/value head keeps while a causal LM decodes.

Shape legend: ``B`` batch, ``H`` query heads, ``G`` key/value heads (of one group), ``N`` kept positions, ``Q`` query
positions of a call, ``D`` head dim.

A policy is one class (a :class:`KVPolicy`, registered by name in :data:`KV_POLICIES`, the one list of names the
command line, ``kv`` and ``bench decode`` read) with its own :meth:`~KVPolicy.score` (what it ranks the keys by,
from what a call :class:`Observed`) and :meth:`~KVPolicy.keep` (the slots that stay):

* ``full`` -- every key (the plain :class:`LayerKV`, bit-identical to it);
* ``window`` -- the first ``sinks`` keys plus the most recent ones, at their original positions (StreamingLLM,
  Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks");
* ``h2o`` -- the most recent half plus the keys with the largest attention received so far, summed over every
  query that read them (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle");
* ``snapkv`` -- once, after the prompt: the keys that the prompt's last 32 queries attend to most, pooled over 7
  neighbours, plus those 32 (Li et al. 2024, "SnapKV"); generated keys are all kept, as in the paper;
* ``tova``, ``knorm``, ``pyramidkv`` -- the last query's attention (TOVA), the smallest key norms (Knorm),
  SnapKV with budgets falling with depth (PyramidKV);
* ``adakv`` -- SnapKV's scores with the layer's budget shared among its heads by one ranking (Ada-KV), each head
  stored at its own length;
* ``expected`` -- the attention the queries to come pay each key in expectation (kvpress's Expected Attention);
* ``streaming`` -- StreamingLLM with keys rotated at their slot in the cache (:class:`StreamingKV`);
* ``head-aware`` -- every key for the retrieval heads, sinks + window for the others (DuoAttention, Xiao et al.
  2024; RazorAttention, Tang et al. 2024): the split is read from :func:`multihead.interpret.kv.heads.classify`.

A call attends with every key it brings (a prompt is read whole, as every paper above does), then the cache is cut
to the budget: the evicted keys' memory is released (the buffers are rebuilt at the budget's size). Under grouped-
query attention a key/value head is shared by its query heads: scores are summed over the group, and the decision
is per shared head. Sliding-window layers (Gemma 3, Mistral) keep only their window under every policy, ``full``
included: the keys past it can never be read again.

A new policy is one class in :mod:`.policies`: subclass :class:`KVPolicy`, give it a ``name``, :meth:`~KVPolicy.of_budget`,
:meth:`~KVPolicy.keep` and, if it ranks keys, :meth:`~KVPolicy.score`; decorate it with :func:`register`. A policy
that decides over a whole layer answers :meth:`~KVPolicy.share`, one that needs another layer cache
:meth:`~KVPolicy.layer_cache`, and :meth:`~KVPolicy.why_not` says where it cannot serve.
"""

from __future__ import annotations

from .cache import KVCache, LayerKV, StreamingKV
from .layer import KVView, LayerCache, RecordedLayer, attend_groups
from .observe import Observed, received_attention
from .policies import (
    TOVA,
    AdaKV,
    ExpectedAttention,
    Full,
    HeadAware,
    HeavyHitters,
    KeyNorm,
    LayerTOVA,
    PyramidKV,
    SinksWindow,
    SnapKV,
    Streaming,
    head_aware_at,
    split_heads,
)
from .policy import (
    KV_POLICIES,
    KVPolicy,
    PolicyKV,
    Rule,
    compress,
    full_policy,
    h2o_policy,
    head_aware_policy,
    make_policy,
    policy_cache,
    recorded_windows,
    register,
    snapkv_policy,
    window_policy,
)

__all__ = [
    "AdaKV",
    "ExpectedAttention",
    "Full",
    "HeadAware",
    "HeavyHitters",
    "KVCache",
    "KVPolicy",
    "KVView",
    "KV_POLICIES",
    "KeyNorm",
    "LayerCache",
    "LayerKV",
    "LayerTOVA",
    "Observed",
    "PolicyKV",
    "PyramidKV",
    "RecordedLayer",
    "Rule",
    "SinksWindow",
    "SnapKV",
    "Streaming",
    "StreamingKV",
    "TOVA",
    "attend_groups",
    "compress",
    "full_policy",
    "h2o_policy",
    "head_aware_at",
    "head_aware_policy",
    "make_policy",
    "policy_cache",
    "received_attention",
    "recorded_windows",
    "register",
    "snapkv_policy",
    "split_heads",
    "window_policy",
]
