import numpy as np

from voxrelay.data.loader import BatchPlan, BatchStream, Cursor


def _plan(n=200, seed=0, **kw):
    rng = np.random.default_rng(123)
    lengths = rng.integers(50, 600, n).tolist()
    durations = (np.asarray(lengths) / 60.0).tolist()
    kw.setdefault("batch_tokens", 2000)
    return BatchPlan(lengths, durations, seed, **kw), lengths, durations


def test_plan_is_pure_function_of_seed_and_epoch():
    a, _, _ = _plan()
    b, _, _ = _plan()
    assert a.batches(0) == b.batches(0)
    assert a.batches(0) != a.batches(1)
    assert _plan(seed=1)[0].batches(0) != a.batches(0)


def test_plan_covers_every_row_once_and_respects_token_budget():
    plan, lengths, _ = _plan()
    batches = plan.batches(3)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 2000 or len(b) == 1


def test_plan_respects_seconds_budget_and_buckets_by_length():
    plan, lengths, durations = _plan(batch_tokens=None, batch_seconds=20.0)
    for b in plan.batches(0):
        assert sum(durations[i] for i in b) <= 20.0 or len(b) == 1
    # bucketed: within a batch lengths are close compared with the whole spread
    spreads = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in plan.batches(0)]
    assert np.mean(spreads) < (max(lengths) - min(lengths)) / 4


def test_stream_resumes_at_cursor_and_splits_ranks():
    plan, _, _ = _plan()
    full = BatchStream(plan, lambda ids: list(ids))
    it = iter(full)
    straight = [next(it) for _ in range(130)]  # crosses an epoch boundary
    first = BatchStream(plan, lambda ids: list(ids))
    it = iter(first)
    head = [next(it) for _ in range(50)]
    state = first.state_dict()
    second = BatchStream(plan, lambda ids: list(ids))
    second.load_state_dict(state)
    it = iter(second)
    tail = [next(it) for _ in range(80)]
    assert head + tail == straight
    # two ranks see disjoint halves of the same global order
    r0, r1 = (iter(BatchStream(plan, lambda ids: list(ids), rank=r, world=2)) for r in (0, 1))
    pairs = [(next(r0), next(r1)) for _ in range(10)]
    assert [x for p in pairs for x in p] == straight[:20]
    assert Cursor().epoch == 0


class _RaggedPlan:
    """A plan whose epochs have 1..5 batches (fewer than processes, sometimes); batch j of epoch e
    is ``[e, j]`` so the consumed order can be read back. Counts its calls (the plan must be cached)."""

    def __init__(self, seed: int):
        self.sizes = np.random.default_rng(seed).integers(1, 6, 1000).tolist()
        self.calls = 0

    def batches(self, epoch: int) -> list[list[int]]:
        self.calls += 1
        return [[epoch, j] for j in range(self.sizes[epoch])]


def _global_order(plan, start: Cursor, count: int) -> list[tuple]:
    """``count`` batches of the single global sequence, from position ``start``."""
    out, epoch, index = [], start.epoch, start.index
    while len(out) < count:
        batches = plan.batches(epoch)
        if index >= len(batches):
            epoch, index = epoch + 1, index - len(batches)
            continue
        out.append(tuple(batches[index]))
        index += 1
    return out


def _run(plan, world: int, state: dict, steps: int) -> tuple[list[tuple], dict]:
    """``steps`` steps of ``world`` processes from ``state``: what they consume, rank by rank within
    a step, and the cursor they end at (the same on every rank)."""
    streams = []
    for rank in range(world):
        stream = BatchStream(plan, tuple, rank=rank, world=world)
        stream.load_state_dict(state)
        streams.append(stream)
    iters = [iter(s) for s in streams]
    consumed = [next(it) for _ in range(steps) for it in iters]
    states = {tuple(sorted(s.state_dict().items())) for s in streams}
    assert len(states) == 1  # every rank keeps the same cursor
    return consumed, streams[0].state_dict()


def test_any_process_count_change_at_any_cursor_continues_the_global_order():
    checked = 0
    for seed in (0, 1):
        plan = _RaggedPlan(seed)
        # every position of the first epochs: mid-epoch, last batch, epoch starts
        starts = [Cursor(e, i) for e in range(4) for i in range(len(plan.batches(e)))]
        for start in starts:
            for old in range(1, 9):
                for new in range(1, 9):
                    for steps_before in (1, 2, 3):
                        state = {"epoch": start.epoch, "index": start.index}
                        head, state = _run(plan, old, state, steps_before)
                        tail, _ = _run(plan, new, state, 3)
                        expected = _global_order(plan, start, len(head) + len(tail))
                        assert head + tail == expected, (seed, start, old, new, steps_before)
                        checked += 1
    assert checked > 2000


def test_one_to_two_processes_at_an_odd_cursor_of_an_even_epoch():
    # the case that raised IndexError: 4 batches per epoch, resumed by 2 processes at index 3
    plan = BatchPlan([100] * 8, [1.0] * 8, seed=0, batch_tokens=200)
    assert len(plan.batches(0)) == 4
    single = BatchStream(plan, tuple)
    it = iter(single)
    straight = [next(it) for _ in range(9)]
    first, state = _run(plan, 1, {"epoch": 0, "index": 0}, 3)
    assert state == {"epoch": 0, "index": 3}
    rest, state = _run(plan, 2, state, 3)
    assert first + rest == straight
    assert state == {"epoch": 2, "index": 1}  # normalised: index < batches of its epoch


def test_cursor_saved_at_the_end_of_an_epoch_resumes_at_the_next_one():
    # checkpoints of earlier versions could hold index == len(batches(epoch)) at an epoch's end
    plan, _, _ = _plan()
    n = len(plan.batches(0))
    stream = BatchStream(plan, tuple)
    stream.load_state_dict({"epoch": 0, "index": n})
    assert next(iter(stream)) == tuple(plan.batches(1)[0])


def test_plan_is_cached_not_recomputed_per_step():
    plan = _RaggedPlan(3)
    stream = BatchStream(plan, tuple, rank=1, world=3)
    it = iter(stream)
    for _ in range(60):
        next(it)
    # once per epoch up to the cursor's; without a cache, two or more per step (>= 120)
    assert plan.calls <= stream.cursor.epoch + 1 < 120


def test_a_square_budget_keeps_batches_of_long_examples_smaller():
    """count x longest² <= square_budget on top of the padded token budget (F5's long clips: attention's memory)."""
    from voxrelay.data.loader import BatchPlan

    lengths = [100] * 10 + [400] * 4
    plain = BatchPlan(lengths, [1.0] * 14, seed=0, batch_tokens=800)
    capped = BatchPlan(lengths, [1.0] * 14, seed=0, batch_tokens=800, square_budget=800 * 200)
    sizes = lambda plan: sorted(  # noqa: E731
        (len(b), max(lengths[i] for i in b)) for b in plan.batches(0))
    assert (2, 400) in sizes(plain)  # the token budget alone: two 400s per batch
    assert all(n == 1 for n, longest in sizes(capped) if longest == 400)  # 2 x 400² > 800 x 200
    assert all(n * longest * longest <= 800 * 200 for n, longest in sizes(capped))
    assert max(n for n, longest in sizes(capped) if longest == 100) == 8  # short ones: the token budget rules
