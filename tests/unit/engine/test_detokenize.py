from tracerl.engine.detokenize import IncrementalDetokenizer, safe_decode


def test_out_of_vocabulary_ids_decode_to_nothing(tiny) -> None:
    _, tokenizer = tiny
    vocab = len(tokenizer)
    hello = tokenizer.encode("hello world", add_special_tokens=False)
    assert safe_decode(tokenizer, [vocab + 3]) == ""
    assert safe_decode(tokenizer, [*hello, vocab, vocab + 100]) == "hello world"


def test_incremental_text_equals_full_decode(tiny) -> None:
    _, tokenizer = tiny
    text = "Grüße aus Köln — 東京 🚀 done."
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add([i]) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_incremental_skips_oov_and_special(tiny) -> None:
    _, tokenizer = tiny
    ids = tokenizer.encode("ok", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    out = detok.add([len(tokenizer) + 1]) + detok.add(ids) + detok.add([tokenizer.eos_token_id])
    assert out + detok.flush() == "ok"
