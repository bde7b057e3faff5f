"""Per-row vLLM request seeds (lorarl.train.vllm_seeds): a row's seed depends on the cell's seed, the step, the
generation call within the step and the row's index in the whole batch, never on the rank that samples it."""

from __future__ import annotations

from types import SimpleNamespace

from tests.support.fake_vllm import SamplingParams
from lorarl.train.vllm_seeds import RowSeeds, row_seed


def trainer(rank: int, step: int = 0, seed: int = 3) -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace(global_step=step), args=SimpleNamespace(seed=seed),
                           accelerator=SimpleNamespace(process_index=rank))


def seeds_of(wrapper: RowSeeds, n: int) -> list[int]:
    calls = []
    wrapper.generate = lambda prompts, sampling_params=None, **kw: calls.append(sampling_params)  # noqa: E731
    shared = SamplingParams(temperature=1.0, max_tokens=4)
    wrapper([{"prompt_token_ids": [1]}] * n, sampling_params=shared)
    assert shared.seed is None  # TRL's own SamplingParams is left as it was
    return [p.seed for p in calls[-1]]


def test_a_row_gets_the_same_seed_on_one_rank_or_two():
    one = seeds_of(RowSeeds(None, trainer(0)), 4)
    two = seeds_of(RowSeeds(None, trainer(0)), 2) + seeds_of(RowSeeds(None, trainer(1)), 2)
    assert one == two and len(set(one)) == 4
    assert one == [row_seed(3, 0, 0, i) for i in range(4)]
    assert seeds_of(RowSeeds(None, trainer(0, seed=4)), 4) != one  # another cell seed: other rollouts


def test_calls_within_a_step_and_new_steps_get_new_seeds():
    t = trainer(0)
    w = RowSeeds(None, t)
    first, refill = seeds_of(w, 2), seeds_of(w, 2)  # DAPO's refill round within the step
    t.state.global_step = 1
    nxt = seeds_of(w, 2)
    assert len({*first, *refill, *nxt}) == 6
    assert refill == [row_seed(3, 0, 1, i) for i in range(2)] and nxt == [row_seed(3, 1, 0, i) for i in range(2)]
    assert seeds_of(RowSeeds(None, trainer(0, step=1)), 2) == nxt  # a resumed run: the same seeds at step 1


def test_a_tensor_parallel_group_numbers_its_gathered_rows_from_its_first_rank():
    # ranks 2 and 3 form the second group of 2: they generate the group's 4 gathered rows, rows 4..7 of the batch
    assert seeds_of(RowSeeds(None, trainer(3), tensor_parallel_size=2), 4) == [row_seed(3, 0, 0, i) for i in range(4, 8)]
