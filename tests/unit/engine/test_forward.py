"""The batched forward pass against the model's own full forward (default float32 tolerances)."""

from __future__ import annotations

import torch

from tracerl.engine.forward import INITIAL_CAPACITY, INITIAL_ROWS, ModelRunner


def full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


def test_mixed_step_matches_separate_full_forwards(tiny) -> None:
    model, _ = tiny
    runner = ModelRunner(model, max_slots=4, max_model_len=512)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 49152, (n,), generator=g).tolist() for n in (5, 12)]
    first = runner.forward(
        torch.empty(0, dtype=torch.long),
        torch.empty(0, dtype=torch.long),
        [(0, torch.tensor(seqs[0]), 0), (1, torch.tensor(seqs[1]), 0)],
    )
    for row, seq in enumerate(seqs):
        torch.testing.assert_close(first[row], full_logits(model, seq))
    # Decode both and prefill two more sequences in the same pass.
    new = [torch.randint(0, 49152, (n,), generator=g).tolist() for n in (3, 9)]
    nxt = [int(first[0].argmax()), int(first[1].argmax())]
    out = runner.forward(
        torch.tensor(nxt),
        torch.tensor([len(s) for s in seqs]),
        [(2, torch.tensor(new[0]), 0), (3, torch.tensor(new[1]), 0)],
    )
    for row, seq in enumerate([seqs[0] + [nxt[0]], seqs[1] + [nxt[1]], *new]):
        torch.testing.assert_close(out[row], full_logits(model, seq))


def test_cache_growth_and_slot_moves_keep_results_exact(tiny) -> None:
    model, _ = tiny
    runner = ModelRunner(model, max_slots=3, max_model_len=1024)
    g = torch.Generator().manual_seed(1)
    seqs = [
        torch.randint(0, 49152, (n,), generator=g).tolist() for n in (INITIAL_CAPACITY - 2, 7, 30)
    ]
    logits = runner.forward(
        torch.empty(0, dtype=torch.long),
        torch.empty(0, dtype=torch.long),
        [(i, torch.tensor(s), 0) for i, s in enumerate(seqs)],
    )
    for _ in range(5):  # slot 0 crosses the initial capacity, which doubles
        nxt = logits.argmax(-1).tolist()
        positions = torch.tensor([len(s) for s in seqs])
        for s, t in zip(seqs, nxt, strict=True):
            s.append(t)
        logits = runner.forward(torch.tensor(nxt), positions, [])
    assert runner.capacity == 2 * INITIAL_CAPACITY
    # Release slot 0: the scheduler moves the last slot into it.
    runner.move_slot(2, 0, len(seqs[2]))
    seqs = [seqs[2], seqs[1]]
    nxt = [int(logits[2].argmax()), int(logits[1].argmax())]
    positions = torch.tensor([len(s) for s in seqs])
    for s, t in zip(seqs, nxt, strict=True):
        s.append(t)
    out = runner.forward(torch.tensor(nxt), positions, [])
    for row, seq in enumerate(seqs):
        torch.testing.assert_close(out[row], full_logits(model, seq))


def test_slots_are_allocated_as_sequences_need_them(tiny) -> None:
    """64 slots allowed, 4 allocated at first: a fifth sequence doubles the rows (and a long
    one the capacity) with the cached K/V kept; an idle engine gives both back."""
    model, _ = tiny
    runner = ModelRunner(model, max_slots=64, max_model_len=1024)
    assert (runner.rows, runner.k_cache[0].shape[0]) == (INITIAL_ROWS, INITIAL_ROWS)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 49152, (9 + i,), generator=g).tolist() for i in range(INITIAL_ROWS)]
    empty = torch.empty(0, dtype=torch.long)
    logits = runner.forward(empty, empty, [(i, torch.tensor(s), 0) for i, s in enumerate(seqs)])
    nxt = logits.argmax(-1).tolist()
    positions = torch.tensor([len(s) for s in seqs])
    for s, t in zip(seqs, nxt, strict=True):
        s.append(t)
    long = torch.randint(0, 49152, (INITIAL_CAPACITY + 3,), generator=g).tolist()
    out = runner.forward(torch.tensor(nxt), positions, [(INITIAL_ROWS, torch.tensor(long), 0)])
    assert runner.rows == 2 * INITIAL_ROWS and runner.capacity == 2 * INITIAL_CAPACITY
    assert runner.k_cache[0].shape[0] == 2 * INITIAL_ROWS
    for row, seq in enumerate([*seqs, long]):
        torch.testing.assert_close(out[row], full_logits(model, seq))
    runner.shrink()
    assert (runner.rows, runner.capacity) == (INITIAL_ROWS, INITIAL_CAPACITY)


def test_a_prefill_after_a_loaded_prefix_matches_the_full_forward(tiny) -> None:
    """A kept prefix (computed partly by decode steps) loaded into another slot, then only the
    new tokens prefilled beside a decode row: the same logits as the whole sequence's forward."""
    model, _ = tiny
    runner = ModelRunner(model, max_slots=3, max_model_len=1024)
    g = torch.Generator().manual_seed(2)
    first = torch.randint(0, 49152, (40,), generator=g).tolist()
    other = torch.randint(0, 49152, (9,), generator=g).tolist()
    empty = torch.empty(0, dtype=torch.long)
    logits = runner.forward(empty, empty, [(0, torch.tensor(first), 0)])
    for _ in range(3):  # the turn's completion: its K/V written by decode steps
        first.append(int(logits[0].argmax()))
        logits = runner.forward(torch.tensor(first[-1:]), torch.tensor([len(first) - 1]), [])
    kept = runner.save_prefix(0, len(first))
    runner.forward(empty, empty, [(0, torch.tensor(other), 0)])  # slot 0 now holds other work
    turn = first + torch.randint(0, 49152, (INITIAL_CAPACITY,), generator=g).tolist()
    runner.load_prefix(1, kept, len(first) - 5)  # part of the kept prefix: the rest recomputed
    out = runner.forward(
        torch.tensor([7]),
        torch.tensor([len(other)]),
        [(1, torch.tensor(turn[len(first) - 5 :]), len(first) - 5)],
    )
    assert runner.capacity == 2 * INITIAL_CAPACITY  # the new turn outgrew the first capacity
    torch.testing.assert_close(out[0], full_logits(model, [*other, 7]))
    torch.testing.assert_close(out[1], full_logits(model, turn))
