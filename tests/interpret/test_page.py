"""The offline page: escaping, and a real headless Chromium (Debian's `chromium`, driven by Playwright)."""

import pytest
import torch

from browser import open_page

from multihead.interpret import AttentionMaps
from multihead.interpret.pages.page import write_page

EVIL = ["[CLS]", "<img src=x onerror=alert(1)>", "</script><script>alert(2)</script>", "a&amp;b", "<!--", "[SEP]"]


def _maps(tokens, layers=2, heads=3):
    torch.manual_seed(0)
    n = len(tokens)
    return AttentionMaps(
        "text <b>bold?</b>", tokens, [torch.softmax(torch.randn(heads, n, n), -1) for _ in range(layers)], "test-model"
    )


def test_page_is_self_contained_and_escapes_tokens(tmp_path):
    path = write_page(_maps(EVIL), tmp_path / "a.html", highlights={(1, 2): "<i>caption</i>"})
    html = path.read_text()
    assert "<img src=x" not in html and "</script><script>alert" not in html and "<i>caption" not in html
    assert html.count("<script") == 2 and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html  # no CDN, no network


def _open(browser, path):
    return open_page(browser, path)


def test_page_in_chromium_head_and_model_views(browser, tmp_path):
    from multihead.interpret import load_subject
    from multihead.interpret.roles import case_study

    maps = load_subject("minilm").maps(case_study.SENTENCE)
    highlights = case_study.highlights(case_study.run(maps))
    path = write_page(maps, tmp_path / "attention.html", highlights=highlights)
    page, problems = _open(browser, path)
    (l0, h0) = next(iter(highlights))  # the page opens on the case study's first head, alone, with its map
    assert page.locator("#current").inner_text() == f"layer {l0}, head {h0}"
    assert page.locator("#headmap").is_visible() and page.locator("#heads label:not(.off)").count() == 1
    page.select_option("#layer", "0")  # another layer: every head of it
    # a text page has no image view: its section stays hidden (a display rule must not override the attribute)
    assert not page.locator("#image-view").is_visible() and not page.locator("#tab-image").is_visible()
    assert page.locator("#image-view").bounding_box() is None
    page.click("#how summary")  # the "how to read this page" panel opens and says what each view is
    assert "Head view" in page.locator("#how").inner_text() and page.locator("#how p").is_visible()
    assert page.locator("#lines text").count() == 2 * 9  # tokens in two columns
    assert page.locator("#heads label").count() == 12
    assert page.locator("#lines line").count() > 0
    page.locator("#heads label[data-head='3']").click()  # toggling a head changes the lines drawn
    assert page.locator("#current").inner_text() == "layer 0, 11 heads"
    page.click("#tab-model")
    assert page.locator(".thumb").count() == 72
    page.locator(".thumb[data-layer='4'][data-head='9']").click()
    assert page.locator("#head-view").is_visible() and not page.locator("#model-view").is_visible()
    assert page.locator("#current").inner_text() == "layer 4, head 9"
    page.locator("#lines text").nth(2).hover()  # focus one query token: only its links remain
    assert page.locator("#lines text.focus").count() == 1
    shot = tmp_path / "head_view.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 5000
    assert problems == []


def test_hostile_tokens_show_as_text_in_chromium(browser, tmp_path):
    path = write_page(_maps(EVIL), tmp_path / "evil.html", highlights={(1, 2): "<i>caption</i>"})
    page, problems = _open(browser, path)
    texts = page.locator("#lines text").all_text_contents()  # SVG text has no innerText
    assert texts[: len(EVIL)] == EVIL  # shown literally
    assert page.locator("img").count() == 0 and page.locator("i").count() == 0
    assert page.locator("#text").inner_text() == "text <b>bold?</b>"
    page.click("#tab-model")
    assert page.locator(".thumb").count() == 6
    assert problems == []  # no alert dialog, no script error


def _image_page(tmp_path, queries):
    from multihead.interpret.pages.page import page_image

    torch.manual_seed(0)
    pixels = (torch.arange(16 * 16).reshape(1, 16, 16) % 256).to(torch.uint8)
    if queries == "patches":  # a ViT: [CLS] + 16 patches attend to [CLS] + 16 patches
        tokens = ["[CLS]"] + [f"patch {r},{c}" for r in range(4) for c in range(4)]
        layers = [torch.softmax(torch.randn(3, 17, 17), -1) for _ in range(2)]
        # head 1 of layer 1: every query looks only at patch (3, 1) = token 1 + 13
        layers[1][1] = 0
        layers[1][1][:, 14] = 1
        maps = AttentionMaps("an image", tokens, layers, "ViT")
        image = page_image(pixels, patch=4, queries="patches", query_offset=1, key_offset=1)
    else:  # cross-attention: 5 words attend to 16 patches
        maps = AttentionMaps(
            "where is the 3 ?",
            ["where", "is", "the", "3", "?"],
            [torch.softmax(torch.randn(4, 5, 16), -1)],
            "question -> canvas",
            key_tokens=[f"patch {r},{c}" for r in range(4) for c in range(4)],
        )
        image = page_image(pixels, patch=4, queries="tokens")
    return write_page(maps, tmp_path / f"{queries}.html", image=image)


def test_page_image_data_is_checked(tmp_path):
    from multihead.interpret.pages.page import page_image

    with pytest.raises(ValueError, match="tiled by the patch"):
        page_image(torch.zeros(1, 10, 10, dtype=torch.uint8), patch=4, queries="patches")
    with pytest.raises(ValueError, match="'patches' or 'tokens'"):
        page_image(torch.zeros(1, 8, 8, dtype=torch.uint8), patch=4, queries="words")
    html = _image_page(tmp_path, "patches").read_text()
    assert '"queries": "patches"' in html and "https://" not in html


def test_image_view_in_chromium_hover_a_patch_or_a_word(browser, tmp_path):
    page, problems = _open(browser, _image_page(tmp_path, "patches"))
    assert page.locator("#image-view").is_visible() and page.locator("#tab-image").is_visible()
    assert page.locator("#image-heads canvas").count() == 3  # one picture per head of the layer
    box = page.locator("#picture").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] * 0.1)  # patch (0, 3)
    assert page.locator("#picture").get_attribute("data-query") == str(1 + 3)
    assert "patch (row 0, column 3)" in page.locator("#image-caption").inner_text()
    page.select_option("#layer", "1")
    assert page.locator("#image-caption").inner_text().startswith("layer 1")
    # head 1 looks only at patch (3, 1): its picture is brightest there (pixels 12..15 down, 4..7 across)
    bright = page.evaluate("""() => {
        const c = document.querySelectorAll('#image-heads canvas')[1].getContext('2d');
        const at = (x, y) => c.getImageData(x, y, 1, 1).data[0];
        return [at(5, 13), at(13, 2)];
    }""")
    assert bright[0] > bright[1] + 100
    page.locator("#image-queries span[data-index='0']").hover()  # [CLS]
    assert "[CLS]" in page.locator("#image-caption").inner_text()
    assert problems == []
    page, problems = _open(browser, _image_page(tmp_path, "tokens"))
    assert page.locator("#image-queries span").count() == 5
    page.locator("#image-queries span[data-index='3']").hover()
    assert page.locator("#picture").get_attribute("data-query") == "3"
    assert "\u201c3\u201d" in page.locator("#image-caption").inner_text()
    assert page.locator("#image-heads canvas").count() == 4
    page.click("#tab-head")  # the other views still work on the same data
    assert page.locator("#lines text").count() == 5 + 16
    assert problems == []


def test_long_pages_carry_links_and_thumbnails_not_maps(tmp_path):
    import base64

    from multihead.interpret.pages.page import FULL_LIMIT, LinkMaps, page_data

    maps = _maps([f"t{i}" for i in range(300)], layers=2, heads=2)
    assert 300 * 300 > FULL_LIMIT
    data = page_data(maps)
    assert data["mode"] == "links" and "weights" not in data and data["k"] == 8 and data["thumb"] == [64, 64]
    lm = LinkMaps.from_maps(maps)
    w, ix = maps.layers[1][0].topk(8, -1)
    assert torch.equal(lm.index[1][0], ix) and torch.allclose(lm.weight[1][0], w)
    raw_i = base64.b64decode(data["links"][1][0]["i"])
    decoded = torch.frombuffer(bytearray(raw_i), dtype=torch.int16).view(300, 8).long()
    assert torch.equal(decoded, ix)  # 16-bit little-endian key indices
    q = torch.tensor(list(base64.b64decode(data["links"][1][0]["w"])), dtype=torch.float32).view(300, 8)
    assert ((q / 255) ** 2 - w).abs().max() < 2 * w.max().sqrt() / 255 + 1e-6  # sqrt-coded 8-bit weights
    torch.testing.assert_close(lm.thumbs[0][1], torch.nn.functional.adaptive_avg_pool2d(maps.layers[0][1][None], 64)[0])
    small = page_data(_maps(["a", "b", "c"]))
    assert small["mode"] == "full" and "weights" in small


def test_long_page_in_chromium_scrolls_hovers_and_draws_a_head_map(browser, tmp_path):
    from multihead.interpret.pages.page import LinkMaps

    torch.manual_seed(0)
    n, k = 2000, 8
    index, weight, thumbs = [], [], []
    for _ in range(2):
        w = torch.softmax(torch.randn(3, n, k) * 3, -1) * 0.5  # the 8 strongest of each row; the rest spread thin
        w, order = w.sort(-1, descending=True)
        idx = torch.randint(0, n, (3, n, k))
        idx[1, :, 0] = (torch.arange(n) - 1).clamp_min(0)  # head 1 looks at the previous token first
        index.append(idx)
        weight.append(w)
        thumbs.append(torch.rand(3, 64, 64))
    lm = LinkMaps("a long text " * 100, [f"tok{i}" for i in range(n)], index, weight, thumbs, "synthetic")
    path = write_page(lm, tmp_path / "long.html")
    assert path.stat().st_size < 1_000_000
    page, problems = _open(browser, path)
    assert page.locator("#lines text").count() == 2 * n
    shown = page.locator("#lines line").count()
    assert 0 < shown < 3 * 3 * 200  # only the rows on screen get lines
    page.locator("#lines text[data-side='q'][data-index='1500']").hover()  # scrolls there; that token's links only
    assert page.locator("#lines text.focus").count() == 1
    assert 3 <= page.locator("#lines line").count() <= 3 * k
    page.mouse.move(2, 2)
    page.click("#tab-model")
    assert page.locator(".thumb").count() == 6
    page.locator(".thumb[data-layer='1'][data-head='1']").click()
    assert page.locator("#headmap").is_visible() and "stored links" in page.locator("#headmap-caption").inner_text()
    assert problems == []


def test_head_map_is_readable_at_any_length_and_zooms(browser, tmp_path):
    """A 6-token map fills the 480-pixel frame (not a 6-pixel speck), with every query token down the left and every
    key token across the top; + zooms around the centre and makes the frame scroll; hovering reads a weight; fit
    shows it whole again."""
    maps = _maps(["the", "cat", "sat", "on", "the", "mat"], layers=1, heads=2)
    page, problems = _open(browser, write_page(maps, tmp_path / "short.html"))
    page.click("#tab-model")
    page.locator(".thumb[data-layer='0'][data-head='1']").click()
    box = page.locator("#headmap-canvas").bounding_box()
    assert max(box["width"], box["height"]) >= 400
    geo = page.locator("#headmap-canvas").evaluate(
        "c => ({ml: +c.dataset.ml, mt: +c.dataset.mt, cell: +c.dataset.cell, w: c.width, h: c.height})"
    )
    assert geo["w"] == geo["ml"] + 6 * geo["cell"] and geo["h"] == geo["mt"] + 6 * geo["cell"]
    inked = page.locator("#headmap-canvas").evaluate(  # the label margins hold text: dark pixels beside each row
        """(c, g) => [...Array(6).keys()].map((i) => {
             const d = c.getContext('2d').getImageData(0, g.mt + i * g.cell, g.ml - 2, g.cell).data;
             let dark = 0; for (let p = 0; p < d.length; p += 4) if (d[p] < 128) dark++; return dark; })""",
        geo,
    )
    assert all(n > 5 for n in inked), inked
    frame = page.locator("#headmap-frame")
    assert frame.evaluate("f => f.scrollWidth <= f.clientWidth + 1")  # fit: nothing to scroll
    page.click("#zoom-in")
    assert page.locator("#headmap-canvas").bounding_box()["width"] >= 1.9 * box["width"]
    assert frame.evaluate("f => f.scrollWidth > f.clientWidth + 100 && f.scrollLeft > 0")  # zoomed around the centre
    assert page.locator("#headmap-zoom").inner_text() == "2.0x"
    page.click("#zoom-fit")
    assert abs(page.locator("#headmap-canvas").bounding_box()["width"] - box["width"]) < 2
    b = page.locator("#headmap-canvas").bounding_box()
    s = b["width"] / geo["w"]  # query 1, key 2: past the label margins, in the middle of the cell
    page.mouse.move(b["x"] + (geo["ml"] + 2.5 * geo["cell"]) * s, b["y"] + (geo["mt"] + 1.5 * geo["cell"]) * s)
    expected = float(maps.layers[0][1, 1, 2])
    text = page.locator("#headmap-hover").inner_text()
    assert text.startswith('query 1 "cat" -> key 2 "sat": ') and abs(float(text.split(": ")[1]) - expected) < 0.01
    assert "darker = more attention" in page.locator("#headmap-caption").inner_text()
    page.set_viewport_size({"width": 1280, "height": 900})
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # nothing runs off the side
    assert problems == []
