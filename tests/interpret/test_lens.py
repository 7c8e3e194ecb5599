"""TransformerLens's habits (:mod:`multihead.interpret.causal.lens`) on a native Llama-shaped LM and an attached HF Llama:
its hook names, its (batch, pos, head, d_head) layout, ``run_with_hooks`` and ``run_with_cache(names_filter=...)``
against multihead's own capture, head mask and formulas written here; the comparison with TransformerLens 4.3
itself is ``multihead bench lens`` (the peers' environment)."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from multihead.interpret.causal.lens import HookedTransformer, utils
from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules.anatomy import anatomy
from multihead.modules.capture import capture
from multihead.modules.decoder import DecoderConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lm"))


@pytest.fixture(scope="module")
def native():
    torch.manual_seed(0)
    dec = DecoderConfig(
        d_model=32,
        num_heads=4,
        num_layers=3,
        d_ff=64,
        dropout=0.0,
        cross_attention=False,
        norm_first=True,
        norm="rms",
        activation="swiglu",
        bias=False,
        attention={"num_kv_heads": 2},
    )
    return CausalLM(CausalLMConfig(vocab_size=100, max_len=64, positional="rope", decoder=dec)).eval()


@pytest.fixture(scope="module")
def attached():
    from hf_families import hf_model

    from multihead.hf import attach

    model = hf_model("llama").eval()
    attach(model)
    return model


IDS = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))


def test_names_layout_and_cache_equal_multiheads_own_capture(native):
    lens = HookedTransformer(native)
    assert lens.cfg.n_layers == 3 and lens.cfg.n_heads == 4 and lens.cfg.n_key_value_heads == 2
    assert {"blocks.0.hook_resid_pre", "blocks.2.attn.hook_z", "blocks.1.hook_mlp_out"} <= set(lens.hook_dict)
    with torch.no_grad():
        logits, cache = lens.run_with_cache(IDS, names_filter=lambda n: n.endswith(("hook_z", "hook_pattern")))
        with capture(native, ("pattern", "z")) as own:
            want = native(IDS)
    torch.testing.assert_close(logits, want)
    assert set(cache) == {f"blocks.{i}.attn.hook_{w}" for i in range(3) for w in ("z", "pattern")}
    for i, name in enumerate(own.attention_modules):
        assert cache["z", i].shape == (2, 12, 4, 8)  # TransformerLens's (batch, pos, head, d_head)
        torch.testing.assert_close(cache["z", i], own[f"{name}.hook_z"].transpose(1, 2))
        torch.testing.assert_close(cache["pattern", i], own[f"{name}.hook_pattern"])
    _, kept = HookedTransformer(native, layout="multihead").run_with_cache(IDS, names_filter="blocks.1.attn.hook_z")
    assert kept["z", 1].shape == (2, 4, 12, 8)
    with pytest.raises(ValueError, match="one expression"):
        lens.run_with_cache(IDS, names_filter=["blocks.0.hook_resid_mid"])
    with pytest.raises(ValueError, match="is not a hook point"):
        lens.run_with_hooks(IDS, fwd_hooks=[("blocks.9.attn.hook_z", lambda z, hook: z)])


def test_a_head_zeroed_on_hook_z_is_the_head_mask_and_the_loss_is_the_formula(native):
    lens = HookedTransformer(native)

    def ablate(z, hook, head):
        assert hook.name == "blocks.1.attn.hook_z" and hook.layer() == 1
        z[:, :, head, :] = 0.0
        return z

    with torch.no_grad():
        got = lens.run_with_hooks(IDS, fwd_hooks=[(utils.get_act_name("z", 1), partial(ablate, head=2))])
        mask = torch.ones(3, 4)
        mask[1, 2] = 0
        torch.testing.assert_close(got, native(IDS, head_mask=mask))
        loss = lens(IDS, return_type="loss")
        logits = native(IDS)
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 100), IDS[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, want)
    assert lens(IDS, return_type=None) is None
    assert not any(h._forward_hooks for h in native.modules())  # removed after the call


@pytest.mark.parametrize("which", ["native", "attached"])
def test_patching_every_position_of_the_residual_gives_the_clean_run(which, request):
    model = request.getfixturevalue(which)
    lens = HookedTransformer(model)
    clean, corrupt = IDS[:1], IDS[1:]
    with torch.no_grad():
        clean_logits, clean_cache = lens.run_with_cache(clean, names_filter=lambda n: n.endswith("resid_pre"))
        for layer in range(lens.cfg.n_layers):

            def patch(resid, hook):
                resid[:] = clean_cache[hook.name]
                return resid

            patched = lens.run_with_hooks(corrupt, fwd_hooks=[(utils.get_act_name("resid_pre", layer), patch)])
            torch.testing.assert_close(patched, clean_logits, atol=1e-5, rtol=0)
        one = lens.run_with_hooks(corrupt, fwd_hooks=[(utils.get_act_name("resid_pre", 1), lambda r, hook: None)])
        torch.testing.assert_close(one, lens(corrupt))  # a hook that returns None reads only


def test_a_failing_hook_leaves_no_hook_behind(attached):
    lens = HookedTransformer(attached)
    assert "blocks.0.hook_resid_mid" in lens.hook_dict  # an attached block has the point between its sublayers

    def broken(t, hook):
        raise RuntimeError("boom")

    def count() -> int:  # attach's own hooks stay; the lens's are gone
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in attached.modules())

    before = count()
    with pytest.raises(RuntimeError, match="boom"):
        lens.run_with_hooks(IDS, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), broken)])
    assert count() == before
    with pytest.raises(ValueError, match="blocks.0.hook_embed is not a hook point of this model"):
        lens.run_with_hooks(IDS, fwd_hooks=[(utils.get_act_name("embed", 0), broken)])
    assert count() == before


@pytest.mark.parametrize("which", ["native", "attached"])
def test_the_logit_lens_and_dla_stacks_add_up_to_the_models_logits(which, request):
    """accumulated_resid through the final norm and W_U is the logit lens (its last entry the model's own logits);
    decompose_resid's parts add up to the final residual; apply_ln_to_stack divides by the final norm's scale, so
    the parts times the norm's weight, through W_U, add up to the logits (formula written here)."""
    from multihead.interpret.causal.patching import logit_lens

    model = request.getfixturevalue(which)
    lens = HookedTransformer(model)
    n = lens.cfg.n_layers
    with torch.no_grad():
        logits, cache = lens.run_with_cache(IDS)
        stack, labels = cache.accumulated_resid(
            layer=-1, incl_mid=True, apply_ln=True, pos_slice=-1, return_labels=True
        )
        assert labels == [f"{l}_{w}" for l in range(n) for w in ("pre", "mid")] + ["final_post"]
        assert stack.shape == (2 * n + 1, 2, lens.cfg.d_model)
        layer_logits = stack @ lens.W_U + lens.b_U
        torch.testing.assert_close(layer_logits[-1], logits[:, -1], atol=1e-4, rtol=0)
        ours = logit_lens(model, IDS)  # multihead's own logit lens: after every layer
        for l in range(n - 1):
            torch.testing.assert_close(layer_logits[2 * (l + 1)], ours[l][:, -1], atol=1e-4, rtol=0)
        mid = cache["resid_mid", 1]
        torch.testing.assert_close(mid, cache["resid_post", 1] - cache["mlp_out", 1], atol=1e-5, rtol=0)

        parts, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
        assert labels == ["embed"] + [f"{l}_{w}" for l in range(n) for w in ("attn_out", "mlp_out")]
        final = cache["resid_post", n - 1][:, -1]
        torch.testing.assert_close(parts.sum(0), final, atol=1e-5, rtol=0)
        scaled = cache.apply_ln_to_stack(parts, layer=-1, pos_slice=-1)
        norm = lens.final_norm
        eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None)) or torch.finfo(final.dtype).eps
        rms = (final.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        torch.testing.assert_close(scaled, parts / rms, atol=1e-6, rtol=0)
        via_parts = (scaled.sum(0) * norm.weight) @ lens.W_U
        torch.testing.assert_close(via_parts, logits[:, -1], atol=1e-4, rtol=0)
        directions = lens.tokens_to_residual_directions(torch.tensor([5, 7]))
        torch.testing.assert_close(directions, lens.W_U[:, [5, 7]].T)
    with pytest.raises(ValueError, match="final norm only"):
        cache.apply_ln_to_stack(parts, layer=1)


class _Chars:
    """A character tokenizer (ids 3..) with TransformerLens's calls' needs: encode(...).ids and decode."""

    class _Enc:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text, add_special_tokens=False):
        return self._Enc([3 + ord(c) % 90 for c in text])

    def decode(self, ids, skip_special_tokens=True):
        special = "" if skip_special_tokens else "<s>"
        return "".join(chr(i - 3) if 3 <= i < 93 else special if i == 1 else "?" for i in ids)


def test_stop_at_layer_returns_the_residual_there_and_runs_nothing_after_it(native):
    lens = HookedTransformer(native)
    _, cache = lens.run_with_cache(IDS, names_filter=lambda n: n.endswith("hook_resid_pre"))
    ran: list[int] = []
    blocks = [s.module for s in anatomy(native).blocks]
    handles = [b.register_forward_hook(lambda m, a, o, i=i: ran.append(i)) for i, b in enumerate(blocks)]
    try:
        resid = lens(IDS, stop_at_layer=1)
        assert ran == [0]  # block 0 ran, blocks 1 and 2 did not
        assert torch.equal(resid, cache["blocks.1.hook_resid_pre"])
        assert torch.equal(lens(IDS, stop_at_layer=-2), resid)  # negative counts from the end, as TransformerLens's
        ran.clear()
        final = lens(IDS, stop_at_layer=3)  # every block, not the final norm
        assert ran == [0, 1, 2]
    finally:
        for h in handles:
            h.remove()
    seen: list[torch.Tensor] = []
    h = anatomy(native).final_norm.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    try:
        native(IDS)
    finally:
        h.remove()
    assert torch.equal(final, seen[0])
    with pytest.raises(ValueError, match="stop_at_layer=4: this model has 3 blocks"):
        lens(IDS, stop_at_layer=4)


def test_remove_batch_dim_loss_per_token_and_the_three_part_name_are_transformer_lens_s(native):
    lens = HookedTransformer(native)
    one = IDS[:1]
    logits, cache = lens.run_with_cache(one, remove_batch_dim=True, names_filter=lambda n: "pattern" in n)
    _, batched = lens.run_with_cache(one, names_filter=lambda n: "pattern" in n)
    assert cache["pattern", 0].shape == (4, 12, 12)  # (head, query, key): no batch axis
    assert torch.equal(cache["pattern", 0, "attn"], batched["blocks.0.attn.hook_pattern"][0])
    with pytest.raises(ValueError, match="remove_batch_dim=True takes one row; these tokens have 2"):
        lens.run_with_cache(IDS, remove_batch_dim=True)
    per_token = lens(IDS, return_type="loss", loss_per_token=True)
    want = F.cross_entropy(native(IDS)[:, :-1].flatten(0, 1), IDS[:, 1:].flatten(), reduction="none")
    assert per_token.shape == (2, 11) and torch.allclose(per_token.flatten(), want, atol=1e-6)
    both = lens(IDS, return_type="both")
    assert torch.allclose(both[1], per_token.mean(), atol=1e-6)


def test_options_not_taken_are_refused_by_name_never_ignored(native):
    lens = HookedTransformer(native)
    with pytest.raises(ValueError, match="takes no option 'frobnicate'"):
        lens.run_with_cache(IDS, frobnicate=True)
    with pytest.raises(ValueError, match=r"run_with_cache\(pos_slice=...\) is TransformerLens's and not taken here"):
        lens.run_with_cache(IDS, pos_slice=-1)
    with pytest.raises(ValueError, match=r"forward\(start_at_layer=...\) is TransformerLens's"):
        lens(IDS, start_at_layer=1)
    with pytest.raises(ValueError, match="takes no option 'foo'"):
        lens.run_with_hooks(IDS, fwd_hooks=[], foo=1)
    with pytest.raises(ValueError, match=r"from_pretrained\(fold_ln=...\) is TransformerLens's"):
        HookedTransformer.from_pretrained("smollm2", fold_ln=True)  # refused before anything is read
    with pytest.raises(ValueError, match="takes no option 'made_up'"):
        HookedTransformer.from_pretrained("smollm2", made_up=1)


def test_single_tokens_strings_device_and_greedy_generation(native):
    lens = HookedTransformer(native, _Chars(), bos_id=1)
    assert lens.cfg.device == torch.device("cpu")
    assert lens.to_single_token("a") == 3 + ord("a") % 90
    with pytest.raises(ValueError, match="'ab' is 2 tokens here"):
        lens.to_single_token("ab")
    out = lens.generate(IDS[:1], max_new_tokens=5, do_sample=False, return_type="tokens", stop_at_eos=False)
    ids = IDS[:1]
    for _ in range(5):  # greedy by hand: the argmax of the last position, fed back
        ids = torch.cat([ids, native(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ids)
    text = lens.generate("abc", max_new_tokens=3, do_sample=False, stop_at_eos=False)
    assert isinstance(text, str) and text.startswith(lens.to_string(lens.to_tokens("abc")[0]))


def test_test_prompt_ranks_the_answer_as_the_logits_say(native, capsys):
    lens = HookedTransformer(native, _Chars(), bos_id=1)
    ranks = utils.test_prompt("abcd", "ef", lens, prepend_space_to_answer=False, top_k=3)
    ids = lens.to_tokens("abcdef")
    logits = native(ids)[0]
    want = [int((logits[4 + i] > logits[4 + i, ids[0, 5 + i]]).sum()) for i in range(2)]  # BOS + 4 prompt tokens
    assert [r for _, r in ranks] == want
    shown = capsys.readouterr().out
    assert "Tokenized prompt:" in shown and "Ranks of the answer tokens:" in shown and shown.count("Top 2th") == 2


def test_transformer_lens_s_patching_helpers_agree_with_multihead_s_own_patching(native):
    from multihead.interpret.causal import patching as P
    from multihead.interpret.causal import tl_patching as patching

    lens = HookedTransformer(native)
    clean = IDS[:1]
    corrupt = clean.clone()
    corrupt[0, 3] = (clean[0, 3] + 7) % 100  # one token changed

    def metric(logits):  # TransformerLens's habit: one number, averaged over the batch
        return (logits[:, -1, 5] - logits[:, -1, 6]).mean()

    _, clean_cache = lens.run_with_cache(clean)
    with torch.no_grad():
        clean_value, corrupt_value = float(metric(native(clean))), float(metric(native(corrupt)))
    resid = patching.get_act_patch_resid_pre(lens, corrupt, clean_cache, metric)
    assert resid.shape == (3, 12)
    assert abs(float(resid[0, 3]) - clean_value) < 1e-5  # the changed token restored where it enters: the clean run
    assert abs(float(resid[0, 0]) - corrupt_value) < 1e-5  # an unchanged position: nothing changes
    heads = patching.get_act_patch_attn_head_out_all_pos(lens, corrupt, clean_cache, metric)
    ours = P.activation_patching(native, clean, corrupt, P.logit_diff(5, 6))  # z from the clean run, per head
    assert heads.shape == (3, 4) and torch.allclose(heads - corrupt_value, ours["effect"], atol=1e-5)
    assert patching.get_act_patch_block_every(lens, corrupt, clean_cache, metric).shape == (3, 3, 12)
    assert patching.get_act_patch_attn_head_out_by_pos(lens, corrupt, clean_cache, metric).shape == (3, 12, 4)
    assert patching.get_act_patch_attn_head_k_all_pos(lens, corrupt, clean_cache, metric).shape == (3, 2)
    with pytest.raises(ValueError, match="shares 2 key/value heads among 4 query heads"):
        patching.get_act_patch_attn_head_all_pos_every(lens, corrupt, clean_cache, metric)


def test_get_act_name_spells_names_as_transformer_lens_does():
    """The spellings of TransformerLens's own docstring, and its notebooks' short names."""
    assert utils.get_act_name("k", 6, "a") == "blocks.6.attn.hook_k"
    assert utils.get_act_name("pre", 2) == "blocks.2.mlp.hook_pre"
    assert utils.get_act_name("embed") == "hook_embed"
    assert utils.get_act_name("normalized", 27, "ln2") == "blocks.27.ln2.hook_normalized"
    assert utils.get_act_name("k6") == "blocks.6.attn.hook_k"
    assert utils.get_act_name("scale4ln1") == "blocks.4.ln1.hook_scale"
    assert utils.get_act_name("scale") == "ln_final.hook_scale"
    assert utils.get_act_name("attn", 0) == "blocks.0.attn.hook_pattern"  # "attn" is the pattern
    assert utils.get_act_name("z", 3, "attn") == "blocks.3.attn.hook_z"
    assert utils.get_act_name("in", 2) == "blocks.2.hook_in"  # TransformerLens 4's name of hook_resid_pre
    assert utils.get_act_name("blocks.1.hook_resid_pre") == "blocks.1.hook_resid_pre"  # a full name as it is
    assert utils.get_device() in ("cpu", "cuda", "mps")


def test_transformer_lens_4_names_reach_the_same_points_and_the_hook_is_told_its_name(native):
    """TransformerLens 4's bridge names (``blocks.L.hook_in``, ``attn.o.hook_in``, ...) are the classic points: the
    Main Demo patches the residual at ``get_act_name("in", layer)`` and reads ``clean_cache[hook.name]``."""
    lens = HookedTransformer(native)
    _, cache = lens.run_with_cache(IDS)
    pairs = {
        "blocks.1.hook_in": "blocks.1.hook_resid_pre",
        "blocks.1.hook_out": "blocks.1.hook_resid_post",
        "blocks.1.attn.hook_out": "blocks.1.hook_attn_out",
        "blocks.1.mlp.hook_out": "blocks.1.hook_mlp_out",
        "blocks.1.attn.q.hook_out": "blocks.1.attn.hook_q",
        "blocks.1.attn.o.hook_in": "blocks.1.attn.hook_z",
        "embed.hook_out": "hook_embed",
    }
    for bridge, classic in pairs.items():
        assert torch.equal(cache[bridge], cache[classic]), bridge
    assert torch.equal(cache["resid_post", -1], cache["blocks.2.hook_resid_post"])  # -1: the last layer
    seen: list[str] = []

    def patch(resid, hook, position):
        seen.append(hook.name)
        resid[:, position, :] = clean[hook.name][:, position, :]
        return resid

    corrupt = IDS.clone()
    corrupt[:, 4] = (IDS[:, 4] + 5) % 100
    _, clean = lens.run_with_cache(IDS)
    got = lens.run_with_hooks(corrupt, fwd_hooks=[(utils.get_act_name("in", 0), partial(patch, position=4))])
    assert seen == ["blocks.0.hook_in"] and torch.allclose(got, native(IDS), atol=1e-5)  # the clean run, restored
    z = lens.run_with_cache(IDS, names_filter=["blocks.0.attn.o.hook_in"])[1]["blocks.0.attn.hook_z"]
    assert z.shape == (2, 12, 4, 8)  # (batch, pos, head, d_head): transposed as hook_z is


def test_loss_fn_token_positions_and_special_tokens_as_transformer_lens_gives_them(native):
    lens = HookedTransformer(native, _Chars(), bos_id=1)
    logits = native(IDS)
    per = lens.loss_fn(logits, IDS, per_token=True)
    want = -logits.log_softmax(-1)[:, :-1].gather(-1, IDS[:, 1:, None])[..., 0]  # the formula
    assert per.shape == (2, 11) and torch.allclose(per, want, atol=1e-5)
    assert torch.allclose(lens.loss_fn(logits, IDS), want.mean(), atol=1e-6)
    assert lens.get_token_position("b", "abcab") == 2  # after the BOS
    assert lens.get_token_position("b", "abcab", prepend_bos=False) == 1
    assert lens.get_token_position("b", "abcab", mode="last") == 5
    with pytest.raises(ValueError, match="is not in the input"):
        lens.get_token_position("z", "abc")
    plain = lens.to_string(lens.to_tokens("ab", prepend_bos=False)[0])
    assert lens.to_string(lens.to_tokens("ab")[0]) == "<s>" + plain  # the BOS spelled out, as TransformerLens shows it
    assert lens.to_str_tokens("ab") == ["<s>", *lens.to_str_tokens("ab", prepend_bos=False)]


def test_stack_head_results_add_up_to_each_layer_s_attention_output(native):
    """Each head's ``z_h W_O^h`` summed over heads is the layer's attention output (no output bias here), and the
    final-norm scaling is the same division as for the layer stack."""
    lens = HookedTransformer(native)
    lens.set_use_attn_result(True)
    _, cache = lens.run_with_cache(IDS)
    stack, labels = cache.stack_head_results(layer=-1, return_labels=True)
    assert stack.shape == (3 * 4, 2, 12, 32) and labels[:2] == ["L0H0", "L0H1"] and labels[-1] == "L2H3"
    for layer in range(3):
        assert torch.allclose(stack[layer * 4 : layer * 4 + 4].sum(0), cache["attn_out", layer], atol=1e-5)
    last = cache.stack_head_results(pos_slice=-1, apply_ln=True)
    assert torch.allclose(last, cache.apply_ln_to_stack(stack[:, :, -1], pos_slice=-1), atol=1e-6)
    with pytest.raises(ValueError, match="incl_remainder=True"):
        cache.stack_head_results(incl_remainder=True)


def test_bench_lens_demos_change_only_the_import_and_model_lines_of_a_notebook(tmp_path):
    """``multihead bench lens --demos``: a notebook's cells become two programs that differ from it only in the
    TransformerLens import lines and the model line; the comparison reads values and printed lines."""
    import json

    from multihead.bench.lens import HEADLESS, _headless, changed_lines, compare, programs, run_demos

    cells = [
        "import torch\nimport transformer_lens.utilities as utils\nfrom transformer_lens import ActivationCache\n"
        "from transformer_lens.model_bridge import TransformerBridge\n",
        "# a markdown cell",
        'model = TransformerBridge.boot_transformers("gpt2")\nmodel.enable_compatibility_mode(\n    fold_ln=True,\n)\n'
        "model.set_use_attn_result(True)\n",
        'logits, cache = model.run_with_cache(model.to_tokens("Hello"))\nprint(logits.shape)\n',
    ]
    notebook = {
        "cells": [
            {"cell_type": "markdown" if i == 1 else "code", "source": text.splitlines(keepends=True)}
            for i, text in enumerate(cells)
        ]
    }
    path = tmp_path / "Demo.ipynb"
    path.write_text(json.dumps(notebook))
    with pytest.raises(ValueError, match="cell 1 is markdown"):
        programs(path, (0, 1), "FOLDER")
    made = programs(path, (0, 2, 3), "FOLDER")
    assert "HookedTransformer.from_pretrained('FOLDER')\nmodel.set_use_attn_result(True)\n" in made["multihead"]
    assert "from multihead.interpret.causal.lens import ActivationCache\n" in made["multihead"]
    assert "enable_compatibility_mode(no_processing=True)" in made["transformer_lens"]
    assert made["original"].count("\n") == made["multihead"].count("\n") + 3  # the three-line call went
    assert changed_lines(made["original"], made["multihead"]) == 7  # 3 import lines + the 4 lines of the model
    assert made["multihead"].endswith(cells[3] + "\n")  # the cell itself unchanged
    a = {"values": {"x": [1.0, 2.0], "s": "a"}, "printed": "one\ntwo\n"}
    b = {"values": {"x": [1.0, 2.5], "s": "a", "y": 3}, "printed": "one\nthree\n"}
    got = compare(a, b)
    assert (
        got["max_abs_diff"] == 0.5 and got["only_one"] == ["y"] and got["printed_lines_differing"] == ["-three", "+two"]
    )
    import builtins

    saved = torch.randint
    try:
        _headless()
        first = torch.randint(0, 100, (5,))
        import plotly.express as px  # a stand-in: draws nothing

        px.imshow([[1]]).show()
    finally:
        torch.randint = saved
        for name in HEADLESS:
            sys.modules.pop(name, None)
        builtins.__dict__.pop("display", None)
    assert torch.equal(first, torch.randint(0, 100, (5,), generator=torch.Generator().manual_seed(0)))
    with pytest.raises(
        ValueError, match=r"no Main_Demo.ipynb, .*Demo.ipynb there; pass a TransformerLens checkout's demos"
    ):
        run_demos(demos=tmp_path, out=tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["Demo.ipynb"]
