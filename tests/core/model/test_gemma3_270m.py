"""The real hybrid model: Gemma 3 270M's 15 sliding layers stop at 512 while seen grows past it.

One module-scoped two-turn session is shared by every test here. It is the README demo
(resources/scripts/hybrid.json: 300 new tokens a turn) made cheaper for CI: a long first message
and 96 new tokens a turn still end turn 1 below the window and turn 2 past it (asserted), for under
a third of the generated tokens. Skipped when the model is not fetched, a
failure where ``KVINSPECT_REQUIRE_GEMMA3=1``.
"""

from __future__ import annotations

import os

import pytest

from kvinspect.core.model.catalog import find_builtin
from kvinspect.core.model.fetch import GEMMA3_270M, is_fetched, terms_path
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.script import GenerationSettings
from tests.conftest import load_cached

#: The first test pays for the module's session: a (warm or cold) load and ~600 generated tokens.
pytestmark = pytest.mark.timeout(1200)

WINDOW = 512
NEW = 96
TURNS = (
    ("Here is what I know so far. Rome began as a small settlement of farmers and shepherds on the hills beside the river Tiber. "
     "According to legend it was founded by Romulus, who became its first king, and for more than two centuries it was ruled by kings. "
     "The last of them was driven out, and the Romans set up a republic governed by two consuls elected every year and by a senate of "
     "powerful families. Over the next centuries the republic fought its neighbours in Italy, then Carthage in three long wars, and "
     "finally the kingdoms of Greece and the East. Its armies grew, its generals grew rich and ambitious, and civil wars followed: "
     "Marius against Sulla, Pompey against Caesar, and at last Octavian against Mark Antony and Cleopatra. Octavian won, took the name "
     "Augustus, and became the first emperor, although he claimed he had only restored the republic. "
     "He kept the old offices and the senate, but he commanded the legions, controlled the richest provinces, paid the "
     "soldiers himself and chose the men who governed in his name. He rebuilt temples, roads and aqueducts, and poets "
     "such as Virgil and Horace praised the peace he brought after a century of war. He had no son of his own, so the "
     "question of who would rule after him troubled his long reign: his nephew Marcellus, his friend Agrippa and two "
     "of his grandsons all died before him, and in the end he adopted his stepson Tiberius, a stern and able general. "
     "Please continue this story in your own words: how did Augustus hold on to power, and who came after him?"),
    "And then, as the empire grew and split in two?",
)


@pytest.fixture(scope="module")
def gemma3():
    if not is_fetched("gemma3-270m"):
        if os.environ.get("KVINSPECT_REQUIRE_GEMMA3"):
            pytest.fail("gemma3-270m is not fetched (run: kvinspect models fetch gemma3-270m)")
        pytest.skip("gemma3-270m not fetched (kvinspect models fetch gemma3-270m)")
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        # Checked on 5.x, which the issue measured; 4.56.2 loads the GGUF but its tokenizer gives the
        # test's first message 731 tokens (5.x: fewer than 420), so the window is passed in turn 1.
        pytest.skip("gemma3-270m is checked on transformers 5.x")
    return load_cached("gemma3-270m")


@pytest.fixture(scope="module")
def two_turns(gemma3):
    """``(session, [(turn, facts read from transformers' cache right after it)])``."""
    settings = GenerationSettings(max_new_tokens=NEW, do_sample=False)
    session = ChatSession(gemma3, SessionOptions(settings=settings))
    out = []
    for text in TURNS:
        turn = session.run_turn(text)
        assert turn.status == "ok", turn.error
        facts = [(type(lay).__name__, int(lay.keys.shape[-2]), int(lay.get_seq_length()),
                  2 * lay.keys.numel() * lay.keys.element_size()) for lay in session.cache.layers]
        out.append((turn, facts))
    session.close()
    return session, out


def test_loads_as_gemma3_with_the_hybrid_layer_types(gemma3):
    assert type(gemma3.model).__name__ == "Gemma3ForCausalLM"
    types = gemma3.model.config.layer_types
    assert types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert gemma3.model.config.sliding_window == WINDOW
    assert find_builtin("gemma3-270m").layer_kinds == tuple(t.split("_")[0] for t in types)
    assert gemma3.load_source in ("gguf", "converted-cache")
    assert any("continues text rather than chats" in n for n in gemma3.notes)
    assert terms_path("gemma3-270m").is_file()  # the licence text travels with the file


def test_sliding_layers_stop_at_the_window_while_seen_grows(two_turns):
    session, turns = two_turns
    (t1, f1), (t2, f2) = turns
    assert t1.prompt_tokens + t1.new_tokens - 1 < WINDOW < t2.prompt_tokens + t2.new_tokens - 1, \
        "the script must pass the window in its second turn"
    assert t2.reused_tokens > 0 and t2.cache_id == t1.cache_id  # one cache, reused
    for turn, facts in turns:
        conversation = turn.prompt_tokens + turn.new_tokens - 1
        for lay, (cls, rows, seen, nbytes) in zip(turn.layers, facts):
            # The probe says exactly what transformers' cache object holds.
            assert (lay["stored"], lay["seen"], lay["bytes"]) == (rows, seen, nbytes), lay["index"]
            assert seen == conversation
            if lay["kind"] == "sliding":
                assert cls == "DynamicSlidingWindowLayer" and lay["window"] == WINDOW
                assert rows == min(conversation, WINDOW - 1)
            else:
                assert lay["kind"] == "full" and cls == "DynamicLayer" and rows == conversation
    final = t2.layers
    assert sum(lay["kind"] == "sliding" and lay["stored"] == WINDOW - 1 < lay["seen"] for lay in final) == 15
    assert sum(lay["kind"] == "full" and lay["stored"] == lay["seen"] for lay in final) == 3
    assert "window_reached" in {e.kind for e in session.record.events}


def test_it_continues_the_transcript_in_words(two_turns):
    _, turns = two_turns
    reply = turns[0][0].reply
    words = [w for w in reply.split() if w.isalpha()]
    # Real words about the prompt, not random-weight gibberish or an immediate stop (a base model may
    # then loop on a short line: its text is not judged here).
    assert len(words) >= 15, reply
    assert "Augustus" in reply or "Rom" in reply, reply


def test_fetch_metadata_matches_the_file():
    assert GEMMA3_270M.size == 253113024
    assert GEMMA3_270M.sha256.startswith("a5fd3b62")
